package ports

import (
	"net/netip"
	"slices"
)

// Proto numbers as the kernel has them.
const (
	ProtoTCP = 6
	ProtoUDP = 17
)

// ProtoNumber is the IP protocol number of "TCP" or "UDP".
func ProtoNumber(p string) uint8 {
	if p == "UDP" {
		return ProtoUDP
	}
	return ProtoTCP
}

// ProtoName is the inverse of ProtoNumber.
func ProtoName(p uint8) string {
	if p == ProtoUDP {
		return "UDP"
	}
	return "TCP"
}

// VKey is one virtual port of one workload.
type VKey struct {
	Workload uint32
	Port     uint16
	Proto    uint8
}

// PKey is a port number of one protocol.
type PKey struct {
	Port  uint16
	Proto uint8
}

// Rule is what a bind to a virtual port draws from.
type Rule struct {
	PoolLo, PoolHi uint16
	ReuseMillis    uint32
	Ephemeral      bool // the rule of port 0
}

// Tables is a set compiled for the datapath.
type Tables struct {
	Cgroups map[uint64]uint32 // cgroup id -> workload id
	VPorts  map[VKey]Rule
	// Index has every virtual port some workload has, with the workload
	// a route sends others to (0: none).
	Index map[PKey]uint32
	// Pool has a bit for every port of every pool.
	Pool [1024]uint64
	// Addrs are the node's own addresses.
	Addrs []netip.Addr
	// WorkloadAddrs are the workloads' own addresses.
	WorkloadAddrs map[netip.Addr]uint32
	// Workloads are the ids in use.
	Workloads []uint32
	// Native are the virtual ports programs of the workloads listened on
	// before their rule existed: they are their bindings.
	Native map[VKey]bool
	// MinLevel and MaxLevel are the levels of the cgroup hierarchy
	// (root: 0) the workloads' cgroups are at.
	MinLevel, MaxLevel uint32
}

// Cgroup is a workload's cgroup: its id and its level in the hierarchy.
type Cgroup struct {
	ID    uint64
	Level uint32
}

// Compile turns a validated set into tables. ids names each workload's id;
// cgroups, each workload's cgroups (resolved by the caller).
func Compile(set *Set, ids map[string]uint32, cgroups map[string][]Cgroup, addrs []netip.Addr) *Tables {
	t := &Tables{Cgroups: map[uint64]uint32{}, VPorts: map[VKey]Rule{}, Index: map[PKey]uint32{}, Addrs: addrs,
		WorkloadAddrs: map[netip.Addr]uint32{}}
	for _, w := range set.Workloads {
		id := ids[w.Name]
		t.Workloads = append(t.Workloads, id)
		for _, cg := range cgroups[w.Name] {
			t.Cgroups[cg.ID] = id
			if t.MinLevel == 0 || cg.Level < t.MinLevel {
				t.MinLevel = cg.Level
			}
			t.MaxLevel = max(t.MaxLevel, cg.Level)
		}
		for _, a := range w.Addresses {
			t.WorkloadAddrs[a] = id
		}
		rule := Rule{PoolLo: uint16(w.Pool.Lo), PoolHi: uint16(w.Pool.Hi), ReuseMillis: uint32(w.ReuseAfterSeconds()) * 1000}
		for p := w.Pool.Lo; p <= w.Pool.Hi; p++ {
			t.Pool[p/64] |= 1 << (p % 64)
		}
		for _, p := range w.Ports {
			proto := ProtoNumber(p.Protocol)
			for v := p.Port.Lo; v <= p.Port.Hi; v++ {
				r := rule
				r.Ephemeral = v == 0
				t.VPorts[VKey{id, uint16(v), proto}] = r
				if v > 0 {
					t.Index[PKey{uint16(v), proto}] = 0
				}
			}
		}
	}
	for _, r := range set.Routes {
		t.Index[PKey{uint16(r.Port), ProtoNumber(r.Protocol)}] = ids[r.To]
	}
	slices.Sort(t.Workloads)
	return t
}

// AssignIDs gives every workload of set an id: the one it had in prev
// (name -> id) if any, else the lowest free one from 1. Ids of workloads
// gone are not reused while sockets may hold their ports: prev keeps
// them until released.
func AssignIDs(set *Set, prev map[string]uint32) map[string]uint32 {
	ids := map[string]uint32{}
	taken := map[uint32]bool{}
	for _, id := range prev {
		taken[id] = true
	}
	for _, w := range set.Workloads {
		if id, ok := prev[w.Name]; ok {
			ids[w.Name] = id
		}
	}
	next := uint32(1)
	for _, w := range set.Workloads {
		if _, ok := ids[w.Name]; ok {
			continue
		}
		for taken[next] {
			next++
		}
		ids[w.Name] = next
		taken[next] = true
	}
	return ids
}
