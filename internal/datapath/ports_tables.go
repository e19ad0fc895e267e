package datapath

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/ports"
)

// CheckPortBudget refuses tables the port maps cannot hold, naming the
// limit, before anything is written.
func CheckPortBudget(t *ports.Tables, poolSizes map[string]int) error {
	switch {
	case len(t.Workloads) > int(portsSlPtLimitsSL_PT_MAX_WORKLOADS):
		return fmt.Errorf("%d workloads: the datapath holds at most %d", len(t.Workloads), portsSlPtLimitsSL_PT_MAX_WORKLOADS)
	case len(t.Cgroups) > int(portsSlPtLimitsSL_PT_MAX_CGROUPS):
		return fmt.Errorf("%d workload cgroups: the datapath holds at most %d", len(t.Cgroups), portsSlPtLimitsSL_PT_MAX_CGROUPS)
	case len(t.VPorts) > int(portsSlPtLimitsSL_PT_MAX_VPORTS):
		return fmt.Errorf("%d virtual ports (ranges count every port): the datapath holds at most %d", len(t.VPorts), portsSlPtLimitsSL_PT_MAX_VPORTS)
	case len(t.Addrs)+len(t.WorkloadAddrs) > int(portsSlPtLimitsSL_PT_MAX_ADDRS):
		return fmt.Errorf("%d node addresses and %d workload addresses: port virtualization holds at most %d", len(t.Addrs), len(t.WorkloadAddrs), portsSlPtLimitsSL_PT_MAX_ADDRS)
	}
	// Claims are made only for pool ports, TCP and UDP: with every pool
	// port of both held, the table is just full, so no pod can fill it
	// (by binding pool ports itself) for others.
	pooled := 0
	for _, w := range t.Pool {
		pooled += bits.OnesCount64(w)
	}
	if 2*pooled > int(portsSlPtLimitsSL_PT_MAX_CLAIMS) {
		return fmt.Errorf("the pools hold %d ports together: at most %d (the real ports of both protocols must fit the claim table)", pooled, portsSlPtLimitsSL_PT_MAX_CLAIMS/2)
	}
	for name, n := range poolSizes {
		if n > int(portsSlPtLimitsSL_PT_MAX_POOL) {
			return fmt.Errorf("workload %s: a pool of %d ports; at most %d", name, n, portsSlPtLimitsSL_PT_MAX_POOL)
		}
	}
	for _, id := range t.Workloads {
		if id == 0 || id > uint32(portsSlPtLimitsSL_PT_MAX_WORKLOADS) {
			return fmt.Errorf("workload id %d out of range 1..%d", id, portsSlPtLimitsSL_PT_MAX_WORKLOADS)
		}
	}
	return nil
}

func ptAddr(a netip.Addr) portsSlPtAddr {
	b := a.As16()
	var k portsSlPtAddr
	for i := range 4 {
		k.Ip[i] = uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24
	}
	return k
}

// syncMap makes m hold exactly want: puts first, then deletes of what is
// no longer wanted (a key both old and new never disappears).
func syncMap[K comparable, V any](m *ebpf.Map, want map[K]V) error {
	for k, v := range want {
		if err := m.Put(&k, &v); err != nil {
			return fmt.Errorf("writing %s: %w", m, err)
		}
	}
	var stale []K
	var k K
	it := m.Iterate()
	var v V
	for it.Next(&k, &v) {
		if _, ok := want[k]; !ok {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading %s: %w", m, err)
	}
	for _, k := range stale {
		if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting from %s: %w", m, err)
		}
	}
	return nil
}

// ApplyPorts makes the port maps hold t. Live claims and bindings are the
// programs' and stay: sockets bound keep their ports, and a rule removed
// stops only new binds and connects.
func (d *Datapath) ApplyPorts(t *ports.Tables) error {
	m := &d.pt.portsMaps
	stats := map[uint32]portsSlPtCount{}
	for _, id := range append([]uint32{0}, t.Workloads...) {
		var c portsSlPtCount
		if err := m.SlPtStats.Lookup(&id, &c); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("reading port counters: %w", err)
		}
		stats[id] = c
	}
	// Counters first (programs add to existing entries only), rules
	// next, and the index, which lets connects in, last.
	if err := syncMap(m.SlPtStats, stats); err != nil {
		return err
	}
	addrs := map[portsSlPtAddr]uint32{}
	for _, a := range t.Addrs {
		addrs[ptAddr(a)] = 0
	}
	for a, id := range t.WorkloadAddrs {
		addrs[ptAddr(a)] = id
	}
	if err := syncMap(m.SlPtAddrs, addrs); err != nil {
		return err
	}
	for w, bits := range t.Pool {
		if err := m.SlPtPool.Put(uint32(w), bits); err != nil {
			return fmt.Errorf("writing the pool bitmap: %w", err)
		}
	}
	vports := map[portsSlPtVkey]portsSlPtRule{}
	for k, r := range t.VPorts {
		v := portsSlPtRule{PoolLo: r.PoolLo, PoolHi: r.PoolHi, ReuseMs: r.ReuseMillis}
		if r.Ephemeral {
			v.Flags = uint32(portsSlPtFlagSL_PT_F_EPHEMERAL)
		}
		vports[portsSlPtVkey{Wl: k.Workload, Port: k.Port, Proto: k.Proto}] = v
	}
	if err := syncMap(m.SlPtVports, vports); err != nil {
		return err
	}
	// Levels widened before the cgroups are written, narrowed after.
	var lv portsSlPtLevels
	if err := m.SlPtCglevels.Lookup(uint32(0), &lv); err != nil {
		return fmt.Errorf("reading the workload levels: %w", err)
	}
	want := portsSlPtLevels{Min: t.MinLevel, Max: t.MaxLevel}
	wide := want
	if lv.Max > 0 {
		wide = portsSlPtLevels{Min: min(lv.Min, want.Min), Max: max(lv.Max, want.Max)}
		if want.Max == 0 {
			wide = lv
		}
	}
	if err := m.SlPtCglevels.Put(uint32(0), wide); err != nil {
		return fmt.Errorf("writing the workload levels: %w", err)
	}
	if err := syncMap(m.SlPtCgroups, t.Cgroups); err != nil {
		return err
	}
	if err := m.SlPtCglevels.Put(uint32(0), want); err != nil {
		return fmt.Errorf("writing the workload levels: %w", err)
	}
	if err := d.syncNative(t.Native); err != nil {
		return err
	}
	index := map[portsSlPtPkey]portsSlPtIndex{}
	for k, route := range t.Index {
		index[portsSlPtPkey{Port: k.Port, Proto: k.Proto}] = portsSlPtIndex{Route: route}
	}
	return syncMap(m.SlPtVindex, index)
}

// PortClaim is a real port held (or resting) in a pool.
type PortClaim struct {
	Workload uint32        `json:"workload_id"`
	Proto    string        `json:"protocol"`
	Virtual  uint16        `json:"virtual"`
	Real     uint16        `json:"real"`
	Sockets  uint32        `json:"sockets"`
	Cookie   uint64        `json:"socket"`
	Age      time.Duration `json:"age_ns"`
	Direct   bool          `json:"direct,omitempty"`
	NetNS    uint64        `json:"netns"`
	// Resting: released (no socket), not yet handed out again; Age is
	// then the time since release (since the bind if it needs no rest).
	Resting bool `json:"resting,omitempty"`
}

// PortClaims lists the real ports the pools hand out, by real port.
func (d *Datapath) PortClaims() ([]PortClaim, error) {
	now, err := monotonicNow()
	if err != nil {
		return nil, err
	}
	var out []PortClaim
	var k portsSlPtPkey
	var c portsSlPtClaim
	it := d.pt.SlPtClaims.Iterate()
	for it.Next(&k, &c) {
		pc := PortClaim{Workload: c.Wl, Proto: ports.ProtoName(k.Proto), Virtual: c.Vport, Real: k.Port,
			Sockets: c.Refs, Cookie: c.Cookie, Direct: c.Direct != 0, NetNS: c.Netns, Resting: c.Refs == 0}
		since := c.SinceNs
		if c.Refs == 0 && c.FreedNs != 0 {
			since = c.FreedNs
		}
		if now > since {
			pc.Age = time.Duration(now - since)
		}
		out = append(out, pc)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading port claims: %w", err)
	}
	slices.SortFunc(out, func(a, b PortClaim) int {
		if a.Real != b.Real {
			return int(a.Real) - int(b.Real)
		}
		return int(a.Proto[0]) - int(b.Proto[0])
	})
	return out, nil
}

// PortStats reads the per-workload counters: id -> counter name -> value.
func (d *Datapath) PortStats() (map[uint32]map[string]uint64, error) {
	names, err := PortCounterNames()
	if err != nil {
		return nil, err
	}
	out := map[uint32]map[string]uint64{}
	var id uint32
	var c portsSlPtCount
	it := d.pt.SlPtStats.Iterate()
	for it.Next(&id, &c) {
		m := map[string]uint64{}
		for i, n := range names {
			m[n] = c.C[i]
		}
		out[id] = m
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading port counters: %w", err)
	}
	return out, nil
}

// ReleasePortClaim returns a held real port to the pool on behalf of
// sockets that closed unseen (an MPTCP listener's subflow is a kernel
// socket, whose release runs no program). The caller checked that no
// socket is bound to it.
func (d *Datapath) ReleasePortClaim(c PortClaim) error {
	now, err := monotonicNow()
	if err != nil {
		return err
	}
	k := portsSlPtPkey{Port: c.Real, Proto: ports.ProtoNumber(c.Proto)}
	var v portsSlPtClaim
	if err := d.pt.SlPtClaims.Lookup(&k, &v); err != nil {
		return fmt.Errorf("reading the claim of port %d/%s: %w", c.Real, c.Proto, err)
	}
	if v.Refs == 0 || v.Cookie != c.Cookie {
		return nil // released, or claimed again, meanwhile
	}
	v.Refs, v.FreedNs = 0, now
	if err := d.pt.SlPtClaims.Update(&k, &v, ebpf.UpdateExist); err != nil {
		return fmt.Errorf("releasing port %d/%s: %w", c.Real, c.Proto, err)
	}
	vk := portsSlPtVkey{Wl: v.Wl, Port: v.Vport, Proto: k.Proto}
	var real uint32
	if err := d.pt.SlPtBinds.Lookup(&vk, &real); err == nil && real == uint32(c.Real) {
		if err := d.pt.SlPtBinds.Delete(&vk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("forgetting the binding of port %d/%s: %w", c.Real, c.Proto, err)
		}
	}
	return nil
}

// syncNative makes the bindings of programs that listened on a virtual
// port before its rule existed (a binding whose real port is the virtual
// port itself: no program writes one) exactly native; a binding the
// programs made is never replaced.
func (d *Datapath) syncNative(native map[ports.VKey]bool) error {
	m := d.pt.SlPtBinds
	var stale []portsSlPtVkey
	var k portsSlPtVkey
	var v uint32
	it := m.Iterate()
	for it.Next(&k, &v) {
		if v == uint32(k.Port) && !native[ports.VKey{Workload: k.Wl, Port: k.Port, Proto: k.Proto}] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading %s: %w", m, err)
	}
	for _, k := range stale {
		if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting from %s: %w", m, err)
		}
	}
	for vk := range native {
		k := portsSlPtVkey{Wl: vk.Workload, Port: vk.Port, Proto: vk.Proto}
		v := uint32(vk.Port)
		if err := m.Update(&k, &v, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			return fmt.Errorf("writing %s: %w", m, err)
		}
	}
	return nil
}
