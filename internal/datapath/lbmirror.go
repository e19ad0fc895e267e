package datapath

import "fmt"

// lbMirror is what the service maps hold, as this Datapath last read or
// wrote them: an apply diffs against it instead of reading the maps
// again, so that one changed Service of thousands costs its own writes.
// Whoever applies with another Datapath (another process) makes it
// stale: the caller says so (ForgetServiceMirror), and a failed apply
// drops it.
type lbMirror struct {
	svcs    map[servicelbSlSvcKey]servicelbSlSvcVal
	members map[uint32]map[servicelbSlBackend]uint32
	slots   map[servicelbSlBackendKey]servicelbSlBackend
	// maglev is the signature of each Maglev frontend's live table
	// (unknown after a read: the tables are rewritten).
	maglev map[uint32]uint64
	// owned are each applied service's frontends (namespace/name: nil
	// after a read, where the maps hold no names).
	owned map[string][]servicelbSlSvcKey
	tag   string
}

// readMirror reads the service maps.
func (d *Datapath) readMirror() (*lbMirror, error) {
	m := &lbMirror{members: map[uint32]map[servicelbSlBackend]uint32{}, maglev: map[uint32]uint64{}}
	var err error
	if m.svcs, err = readAll[servicelbSlSvcKey, servicelbSlSvcVal](d.lb.SlSvc); err != nil {
		return nil, fmt.Errorf("reading services: %w", err)
	}
	memberList, err := readAll[servicelbSlMemberKey, servicelbSlMember](d.lb.SlSvcMembers)
	if err != nil {
		return nil, fmt.Errorf("reading service members: %w", err)
	}
	for mk, v := range memberList {
		m.setMember(mk, v.State)
	}
	if m.slots, err = readAll[servicelbSlBackendKey, servicelbSlBackend](d.lb.SlSvcBackends); err != nil {
		return nil, fmt.Errorf("reading backends: %w", err)
	}
	return m, nil
}

func (m *lbMirror) setMember(mk servicelbSlMemberKey, state uint32) {
	if m.members[mk.Id] == nil {
		m.members[mk.Id] = map[servicelbSlBackend]uint32{}
	}
	m.members[mk.Id][mk.Be] = state
}

func (m *lbMirror) dropMember(mk servicelbSlMemberKey) {
	delete(m.members[mk.Id], mk.Be)
	if len(m.members[mk.Id]) == 0 {
		delete(m.members, mk.Id)
	}
}

// ServiceMirrorTag is the tag the caller gave the state this Datapath
// last programmed ("" when it holds none).
func (d *Datapath) ServiceMirrorTag() string {
	if d.lbm == nil {
		return ""
	}
	return d.lbm.tag
}

// SetServiceMirrorTag tags the state last programmed (the caller's
// record of it: an apply by anyone else changes the record).
func (d *Datapath) SetServiceMirrorTag(tag string) {
	if d.lbm != nil {
		d.lbm.tag = tag
	}
}

// ForgetServiceMirror makes the next apply read the maps.
func (d *Datapath) ForgetServiceMirror() { d.lbm = nil }
