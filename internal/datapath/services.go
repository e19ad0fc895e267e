package datapath

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"time"

	"github.com/socklane/socklane/internal/service"
)

// IP protocol numbers of service ports.
const bankShift = servicelbSlLbLayoutSL_BANK_SHIFT

// frontend is the datapath's view of one (VIP, port, protocol).
type frontend struct {
	key      servicelbSlSvcKey
	backends []servicelbSlBackend // ready first, then terminating
	ready    int
	idle     []servicelbSlBackend // members that take no new connections
	affinity uint32
	maglev   bool
	weights  []uint16 // of the ready backends, for Maglev
}

// frontendKey is the datapath's key of a service's binding.
func frontendKey(at service.Binding) servicelbSlSvcKey {
	return servicelbSlSvcKey{Ip: addrWords(at.VIP), Port: at.Frontend.Port, Proto: at.Port.Protocol.Number()}
}

// frontendsOf are the services' frontends; owned lists each service's.
func frontendsOf(svcs []*service.Service, owned map[string][]servicelbSlSvcKey) map[servicelbSlSvcKey]*frontend {
	out := map[servicelbSlSvcKey]*frontend{}
	for _, s := range svcs {
		var keys []servicelbSlSvcKey
		for _, at := range s.Bindings() {
			p, vip := at.Port, at.VIP
			f := &frontend{key: frontendKey(at)}
			keys = append(keys, f.key)
			if s.Affinity == service.AffinityClientIP {
				f.affinity = uint32(s.Timeout / time.Second)
			}
			f.maglev = s.Selection == service.SelectMaglev
			for _, role := range []service.Role{service.RoleReady, service.RoleFallback, service.RoleIdle} {
				for _, b := range s.Backends {
					port, serves := b.TargetPort(p)
					if s.RoleAt(b, at) != role || b.IP.Is4() != vip.Is4() || !serves {
						continue
					}
					be := servicelbSlBackend{Ip: addrWords(b.IP), Port: port}
					switch role {
					case service.RoleIdle:
						f.idle = append(f.idle, be)
						continue
					case service.RoleReady:
						f.ready++
						f.weights = append(f.weights, b.Weight)
					}
					f.backends = append(f.backends, be)
				}
			}
			out[f.key] = f
		}
		owned[s.Key()] = keys
	}
	return out
}

// memberDiff collects the writes that turn frontends' members into
// others: members new or with another state, those new (their counters
// start), and those gone (their sockets are stale).
type memberDiff struct {
	keys        []servicelbSlMemberKey
	vals        []servicelbSlMember
	added, gone []servicelbSlMemberKey
}

// diff adds what turns frontend id's members have into now.
func (md *memberDiff) diff(id uint32, have, now map[servicelbSlBackend]uint32) {
	for b, state := range now {
		mk := servicelbSlMemberKey{Id: id, Be: b}
		prev, ok := have[b]
		if !ok || prev != state {
			md.keys = append(md.keys, mk)
			md.vals = append(md.vals, servicelbSlMember{State: state})
		}
		if !ok {
			md.added = append(md.added, mk)
		}
	}
	for b := range have {
		if _, ok := now[b]; !ok {
			md.gone = append(md.gone, servicelbSlMemberKey{Id: id, Be: b})
		}
	}
}

// members are the frontend's backends by their state in sl_svc_members.
func (f *frontend) members() map[servicelbSlBackend]uint32 {
	out := make(map[servicelbSlBackend]uint32, len(f.backends)+len(f.idle))
	for i, b := range f.backends {
		out[b] = uint32(servicelbSlMemberStateSL_MEMBER_READY)
		if i >= f.ready {
			out[b] = uint32(servicelbSlMemberStateSL_MEMBER_TERMINATING)
		}
	}
	for _, b := range f.idle {
		if _, dup := out[b]; !dup {
			out[b] = uint32(servicelbSlMemberStateSL_MEMBER_IDLE)
		}
	}
	return out
}

// ApplyStats reports what an apply changed.
type ApplyStats struct {
	Frontends, Added, Updated, Removed int
	// Stale counts the (frontend, backend) pairs the apply removed, and
	// Destroyed the connected sockets of those pairs that were destroyed
	// (filled in by whoever destroys them: see StaleSockets).
	Stale, Destroyed int
	Took             time.Duration

	removed []servicelbSlMemberKey
}

// ApplyServices makes the load balancer serve exactly set. Each frontend
// changes in one map update (its new backends are written to the bank not
// in use first), so a connect sees the old backends or the new ones, never
// a mix; the bank it leaves stays until the next change of the frontend
// rewrites it, so a connect that read the frontend just before the switch
// finds its slot (one that read it two changes ago reads the frontend
// again: SL_LB_BANK_RETRIES). Connections already established are not
// touched.
func (d *Datapath) ApplyServices(set *service.Set) (ApplyStats, error) {
	start := time.Now()
	mirror := d.lbm
	if mirror == nil {
		var err error
		if mirror, err = d.readMirror(); err != nil {
			return ApplyStats{}, err
		}
	}
	owned := map[string][]servicelbSlSvcKey{}
	want := frontendsOf(set.Services, owned)
	return d.applyFrontends(start, mirror, want, true, nil, owned)
}

// ErrNoServiceMirror: UpdateServices needs what this Datapath last
// applied (ApplyServices, then updates), not maps another process wrote.
var ErrNoServiceMirror = errors.New("the services this datapath last applied are not known: apply the whole set")

// UpdateServices changes what the last ApplyServices (and updates since)
// of this Datapath programmed: changed services (new, or defined anew)
// replace their frontends, removed ones (by namespace/name) lose theirs,
// and no other frontend is looked at: the cost is the change's. Each
// frontend changes as in ApplyServices. Without the record of the last
// apply (another process applied, an apply failed) it returns
// ErrNoServiceMirror and changes nothing.
func (d *Datapath) UpdateServices(changed []*service.Service, removed []string) (ApplyStats, error) {
	start := time.Now()
	mirror := d.lbm
	if mirror == nil || mirror.owned == nil {
		return ApplyStats{}, ErrNoServiceMirror
	}
	owned := map[string][]servicelbSlSvcKey{}
	want := frontendsOf(changed, owned)
	var scope []servicelbSlSvcKey
	for k := range owned {
		scope = append(scope, mirror.owned[k]...)
	}
	for _, k := range removed {
		if _, again := owned[k]; !again {
			scope = append(scope, mirror.owned[k]...)
			owned[k] = nil
		}
	}
	return d.applyFrontends(start, mirror, want, false, scope, owned)
}

// applyFrontends programs want; the frontends that go are those of the
// mirror not wanted (all), or else those of scope not wanted. owned are
// the services' frontends now (nil: a service gone).
func (d *Datapath) applyFrontends(start time.Time, mirror *lbMirror, want map[servicelbSlSvcKey]*frontend, all bool, scope []servicelbSlSvcKey, owned map[string][]servicelbSlSvcKey) (ApplyStats, error) {
	var st ApplyStats
	// Until this apply has written everything, the maps may hold part
	// of it: the next apply reads them.
	d.lbm = nil
	have, members, slots := mirror.svcs, mirror.members, mirror.slots
	usedIDs := make(map[uint32]bool, len(have))
	for _, v := range have {
		usedIDs[v.Id] = true
	}
	nextID := uint32(1)
	newID := func() uint32 {
		for usedIDs[nextID] {
			nextID++
		}
		usedIDs[nextID] = true
		return nextID
	}

	var bKeys []servicelbSlBackendKey
	var bVals []servicelbSlBackend
	var md memberDiff
	var sKeys []servicelbSlSvcKey
	var sVals []servicelbSlSvcVal
	var staleB, leftB []servicelbSlBackendKey
	var newRefused []uint32
	var mgKeys, staleMg []servicelbSlMaglevKey
	var mgVals []servicelbSlMaglev
	var mgSigs []uint64
	for key, f := range want {
		old, exists := have[key]
		val := servicelbSlSvcVal{Ready: uint16(f.ready), Terminating: uint16(len(f.backends) - f.ready), AffinityS: f.affinity}
		var sig uint64
		if f.maglev {
			val.Flags = uint16(servicelbSlSvcFlagSL_SVC_MAGLEV)
			sig = maglevSig(f.backends[:f.ready], f.weights)
		}
		now := f.members()
		if exists {
			val.Id, val.Bank = old.Id, old.Bank^1
			if old.Flags&uint16(servicelbSlSvcFlagSL_SVC_MAGLEV) != 0 && !f.maglev {
				staleMg = append(staleMg, servicelbSlMaglevKey{Id: old.Id, Bank: 0}, servicelbSlMaglevKey{Id: old.Id, Bank: 1})
			}
			if sameBackends(slots, old, f) && old.AffinityS == f.affinity && old.Flags == val.Flags && (!f.maglev || mirror.maglev[old.Id] == sig) {
				// The slots stand; members may have changed
				// state (ready, not ready) without a new bank.
				if !maps.Equal(members[old.Id], now) {
					st.Updated++
					md.diff(old.Id, members[old.Id], now)
				}
				continue
			}
			st.Updated++
			// The live bank stays as it is: a connect that read the
			// frontend before the switch still finds its slot there.
			// The bank written now may hold more slots, from the
			// apply before last: they go before the switch.
			for i := len(f.backends); ; i++ {
				k := servicelbSlBackendKey{Id: old.Id, Slot: uint32(val.Bank)<<bankShift | uint32(i)}
				if _, ok := slots[k]; !ok {
					break
				}
				leftB = append(leftB, k)
			}
		} else {
			val.Id = newID()
			st.Added++
			newRefused = append(newRefused, val.Id)
		}
		for i, b := range f.backends {
			bKeys = append(bKeys, servicelbSlBackendKey{Id: val.Id, Slot: uint32(val.Bank)<<bankShift | uint32(i)})
			bVals = append(bVals, b)
		}
		if f.maglev && f.ready > 0 {
			mgKeys = append(mgKeys, servicelbSlMaglevKey{Id: val.Id, Bank: uint32(val.Bank)})
			mgVals = append(mgVals, *maglevTable(f.backends[:f.ready], f.weights))
			mgSigs = append(mgSigs, sig)
		}
		md.diff(val.Id, members[val.Id], now)
		sKeys = append(sKeys, key)
		sVals = append(sVals, val)
	}
	var goneIDs []uint32
	var goneKeys []servicelbSlSvcKey
	leaving := func(yield func(servicelbSlSvcKey, servicelbSlSvcVal) bool) {
		if all {
			for key, old := range have {
				if !yield(key, old) {
					return
				}
			}
			return
		}
		seen := make(map[servicelbSlSvcKey]bool, len(scope))
		for _, key := range scope {
			if old, ok := have[key]; ok && !seen[key] {
				seen[key] = true
				if !yield(key, old) {
					return
				}
			}
		}
	}
	for key, old := range leaving {
		if _, ok := want[key]; ok {
			continue
		}
		st.Removed++
		goneKeys = append(goneKeys, key)
		goneIDs = append(goneIDs, old.Id)
		for bank := range uint32(2) {
			for i := range int(old.Ready) + int(old.Terminating) {
				staleB = append(staleB, servicelbSlBackendKey{Id: old.Id, Slot: bank<<bankShift | uint32(i)})
			}
		}
		md.diff(old.Id, members[old.Id], nil)
		if old.Flags&uint16(servicelbSlSvcFlagSL_SVC_MAGLEV) != 0 {
			staleMg = append(staleMg, servicelbSlMaglevKey{Id: old.Id, Bank: 0}, servicelbSlMaglevKey{Id: old.Id, Bank: 1})
		}
	}

	// New banks and members first, then publish, then clean up.
	if err := deleteAll(d.lb.SlSvcBackends, leftB); err != nil {
		return st, fmt.Errorf("clearing the banks to write: %w", err)
	}
	if err := batchPut(d.lb.SlSvcBackends, bKeys, bVals); err != nil {
		return st, fmt.Errorf("writing backends: %w", err)
	}
	if err := batchPut(d.lb.SlSvcMembers, md.keys, md.vals); err != nil {
		return st, fmt.Errorf("writing service members: %w", err)
	}
	// Counters start at zero for members and frontends new to the
	// load balancer; existing ones keep counting.
	if err := batchPut(d.lb.SlSvcSelected, md.added, make([]uint64, len(md.added))); err != nil {
		return st, fmt.Errorf("creating selection counters: %w", err)
	}
	if err := batchPut(d.lb.SlSvcRefused, newRefused, make([]uint64, len(newRefused))); err != nil {
		return st, fmt.Errorf("creating refusal counters: %w", err)
	}
	if err := batchPut(d.lb.SlSvcMaglev, mgKeys, mgVals); err != nil {
		return st, fmt.Errorf("writing Maglev tables: %w", err)
	}
	if err := batchPut(d.lb.SlSvc, sKeys, sVals); err != nil {
		return st, fmt.Errorf("publishing services: %w", err)
	}
	if err := deleteAll(d.lb.SlSvc, goneKeys); err != nil {
		return st, fmt.Errorf("removing services: %w", err)
	}
	if err := deleteAll(d.lb.SlSvcBackends, staleB); err != nil {
		return st, fmt.Errorf("removing old backends: %w", err)
	}
	st.removed, st.Stale = md.gone, len(md.gone)
	if err := deleteAll(d.lb.SlSvcMembers, md.gone); err != nil {
		return st, fmt.Errorf("removing old members: %w", err)
	}
	if err := deleteAll(d.lb.SlSvcSelected, md.gone); err != nil {
		return st, fmt.Errorf("removing old counters: %w", err)
	}
	if err := deleteAll(d.lb.SlSvcRefused, goneIDs); err != nil {
		return st, fmt.Errorf("removing old counters: %w", err)
	}
	if err := deleteAll(d.lb.SlSvcMaglev, staleMg); err != nil {
		return st, fmt.Errorf("removing old Maglev tables: %w", err)
	}
	// The mirror takes what was written.
	for i, k := range sKeys {
		have[k] = sVals[i]
	}
	for _, k := range goneKeys {
		delete(have, k)
	}
	for _, k := range leftB {
		delete(slots, k)
	}
	for i, k := range bKeys {
		slots[k] = bVals[i]
	}
	for _, k := range staleB {
		delete(slots, k)
	}
	for i, mk := range md.keys {
		mirror.setMember(mk, md.vals[i].State)
	}
	for _, mk := range md.gone {
		mirror.dropMember(mk)
	}
	for i, k := range mgKeys {
		mirror.maglev[k.Id] = mgSigs[i]
	}
	for _, k := range staleMg {
		delete(mirror.maglev, k.Id)
	}
	if all {
		mirror.owned = owned
	} else {
		for k, keys := range owned {
			if keys == nil {
				delete(mirror.owned, k)
			} else {
				mirror.owned[k] = keys
			}
		}
	}
	mirror.tag = ""
	d.lbm = mirror
	st.Frontends = len(have)
	st.Took = time.Since(start)
	return st, nil
}

func sameBackends(slots map[servicelbSlBackendKey]servicelbSlBackend, old servicelbSlSvcVal, f *frontend) bool {
	if int(old.Ready) != f.ready || int(old.Ready)+int(old.Terminating) != len(f.backends) {
		return false
	}
	for i, b := range f.backends {
		got, ok := slots[servicelbSlBackendKey{Id: old.Id, Slot: uint32(old.Bank)<<bankShift | uint32(i)}]
		if !ok || got != b {
			return false
		}
	}
	return true
}

// Selection is how often the load balancer chose one backend of one
// frontend.
type Selection struct {
	Frontend service.Frontend `json:"frontend"`
	Backend  netip.AddrPort   `json:"backend"`
	Count    uint64           `json:"count"`
}

// LBStats is the load balancer's state as the datapath sees it.
type LBStats struct {
	Counters   Counts[LBCounter] `json:"counters"`
	Selections []Selection       `json:"selections"`
	Refused    map[string]uint64 `json:"refused"` // per frontend
}

// ServiceStats reads the load balancer's counters.
func (d *Datapath) ServiceStats() (*LBStats, error) {
	counters, err := d.LBCounters()
	if err != nil {
		return nil, err
	}
	out := &LBStats{Counters: counters, Refused: map[string]uint64{}}
	fronts := map[uint32]service.Frontend{}
	var k servicelbSlSvcKey
	var v servicelbSlSvcVal
	it := d.lb.SlSvc.Iterate()
	for it.Next(&k, &v) {
		fronts[v.Id] = service.Frontend{VIP: wordsAddr(k.Ip), Port: k.Port, Protocol: service.ProtocolOf(k.Proto)}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading services: %w", err)
	}
	selected, err := readAll[servicelbSlMemberKey, uint64](d.lb.SlSvcSelected)
	if err != nil {
		return nil, fmt.Errorf("reading selection counters: %w", err)
	}
	for mk, n := range selected {
		if f, ok := fronts[mk.Id]; ok {
			out.Selections = append(out.Selections, Selection{Frontend: f, Backend: netip.AddrPortFrom(wordsAddr(mk.Be.Ip), mk.Be.Port), Count: n})
		}
	}
	refused, err := readAll[uint32, uint64](d.lb.SlSvcRefused)
	if err != nil {
		return nil, fmt.Errorf("reading refusal counters: %w", err)
	}
	for id, n := range refused {
		if f, ok := fronts[id]; ok {
			out.Refused[f.String()] = n
		}
	}
	return out, nil
}
