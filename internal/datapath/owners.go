package datapath

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
)

// Quotas are what one owner (a cgroup) may hold of the node-wide tables.
type Quotas struct {
	Conns       uint64 `json:"conns"`
	Listeners   uint64 `json:"listeners"`
	LBConns     uint64 `json:"lb_conns"`
	Affinity    uint64 `json:"affinity"`
	UDPTables   uint64 `json:"udp_tables"`
	EvictTimers uint64 `json:"evict_timers"`
	Msgs        uint64 `json:"messages"`
}

// Owner is what one cgroup holds of the node-wide tables, and what it was
// refused beyond its quota.
type Owner struct {
	Cgroup             uint64 `json:"cgroup_id"`
	Path               string `json:"cgroup,omitempty"`
	Conns              uint64 `json:"conns"`
	Listeners          uint64 `json:"listeners"`
	LBConns            uint64 `json:"lb_conns"`
	RefusedConns       uint64 `json:"refused_conns"`
	RefusedListeners   uint64 `json:"refused_listeners"`
	RefusedLBConns     uint64 `json:"refused_lb_conns"`
	Affinity           uint64 `json:"affinity"`
	RefusedAffinity    uint64 `json:"refused_affinity"`
	UDPTables          uint64 `json:"udp_tables"`
	RefusedUDPTables   uint64 `json:"refused_udp_tables"`
	EvictTimers        uint64 `json:"evict_timers"`
	RefusedEvictTimers uint64 `json:"refused_evict_timers"`
	// Msgs is what its connections' sends may hold in their readers'
	// queues, in messages; RefusedMsgs the sends refused beyond it.
	Msgs        uint64 `json:"messages"`
	RefusedMsgs uint64 `json:"refused_messages"`
}

// Refused reports whether the owner was ever refused an entry.
func (o Owner) Refused() bool {
	return o.RefusedConns+o.RefusedListeners+o.RefusedLBConns+o.RefusedAffinity+o.RefusedUDPTables+o.RefusedEvictTimers+o.RefusedMsgs > 0
}

// Owners lists every owner the datapath charged, in cgroup id order.
func (d *Datapath) Owners() ([]Owner, error) {
	by := map[uint64]*Owner{}
	get := func(id uint64) *Owner {
		if by[id] == nil {
			by[id] = &Owner{Cgroup: id}
		}
		return by[id]
	}
	bp, err := readAll[uint64, bypassSlOwner](d.objs.SlOwners)
	if err != nil {
		return nil, fmt.Errorf("reading sl_owners: %w", err)
	}
	for id, v := range bp {
		o := get(id)
		o.Conns, o.Listeners, o.RefusedConns, o.RefusedListeners = v.Conns, v.Listeners, v.RefusedConns, v.RefusedListeners
		o.EvictTimers, o.RefusedEvictTimers = v.EvictTimers, v.RefusedEvictTimers
		o.Msgs, o.RefusedMsgs = v.Msgs, v.RefusedMsgs
	}
	lb, err := readAll[uint64, servicelbSlLbOwner](d.lb.SlLbOwners)
	if err != nil {
		return nil, fmt.Errorf("reading sl_lb_owners: %w", err)
	}
	for id, v := range lb {
		o := get(id)
		o.LBConns, o.RefusedLBConns = v.Conns, v.Refused
		o.Affinity, o.RefusedAffinity = v.Affinity, v.AffinityRefused
		o.UDPTables, o.RefusedUDPTables = v.UdpTables, v.UdpTablesRefused
	}
	out := make([]Owner, 0, len(by))
	for _, o := range by {
		out = append(out, *o)
	}
	slices.SortFunc(out, func(a, b Owner) int { return cmp.Compare(a.Cgroup, b.Cgroup) })
	return out, nil
}

// ForgetOwner removes the entries of an owner whose cgroup is gone: the
// owners tables hold at most SL_MAX_OWNERS, and cgroups come and go.
func (d *Datapath) ForgetOwner(id uint64) error {
	for _, m := range []*ebpf.Map{d.objs.SlOwners, d.lb.SlLbOwners} {
		if err := m.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("forgetting owner %d: %w", id, err)
		}
	}
	return nil
}

// ListenerSeed is a listening socket found in a cgroup being attached.
type ListenerSeed struct {
	Netns    uint64 // network namespace cookie
	Port     uint16
	Owner    uint64 // cgroup id of the process holding it
	Blocking bool   // the listening socket's file is blocking
	// Caught are the signals its process handles (bit signal - 1, as
	// /proc/PID/status's SigCgt).
	Caught uint64
}

// SignalsOf is the enum sl_signals of a process that handles the signals
// caught (bit signal - 1): the datapath's rule (sl_signals.h), for
// processes it did not see.
func SignalsOf(caught uint64) uint32 {
	mask := uint64(bypassSlSigMaskSL_SIG_MASK_HI)<<32 | uint64(bypassSlSigMaskSL_SIG_MASK_LO)
	if caught&mask != 0 {
		return uint32(bypassSlSignalsSL_SIG_INTERRUPTS)
	}
	return uint32(bypassSlSignalsSL_SIG_QUIET)
}

// SeedListener records a listener that was listening before the datapath
// was attached to its cgroup (so no listen() was seen), unless one is
// recorded. Returns whether it was recorded.
func (d *Datapath) SeedListener(l ListenerSeed) (bool, error) {
	args := bypassSlSeedArgs{Netns: l.Netns, Owner: l.Owner, Port: uint32(l.Port), Signals: SignalsOf(l.Caught)}
	if l.Blocking {
		args.Blocking = 1
	}
	ret, err := d.objs.SlSeedListener.Run(&ebpf.RunOptions{Context: args})
	if err != nil {
		return false, fmt.Errorf("recording listener on port %d: %w", l.Port, err)
	}
	return ret == 1, nil
}

// ForgetListenersOf removes the listener entries charged to owners whose
// cgroups are gone (the listeners' close was not seen).
func (d *Datapath) ForgetListenersOf(gone map[uint64]bool) (int, error) {
	if len(gone) == 0 {
		return 0, nil
	}
	var stale []bypassSlListener
	var k bypassSlListener
	v := make([]byte, d.objs.SlListeners.ValueSize())
	it := d.objs.SlListeners.Iterate()
	for it.Next(&k, &v) {
		// struct sl_listener_val: the information first (the socket
		// pointer after it has no Go type).
		var info bypassSlListenerInfo
		if _, err := binary.Decode(v, binary.NativeEndian, &info); err == nil && gone[info.Owner] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("reading sl_listeners: %w", err)
	}
	n := 0
	for _, k := range stale {
		if err := d.objs.SlListeners.Delete(&k); err == nil {
			n++
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, fmt.Errorf("forgetting listener: %w", err)
		}
	}
	return n, nil
}
