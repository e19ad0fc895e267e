package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/socklane/socklane/internal/cgroups"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/ports"
	"github.com/socklane/socklane/internal/procsock"
	"github.com/socklane/socklane/internal/sockdiag"
	"golang.org/x/sys/unix"
)

const portsFile = "ports.json"

// PortsRecord is what an apply of port rules leaves for `ports list` and
// the next apply: the rules, every workload's id, and the ids of
// workloads removed while sockets still hold ports of theirs (not handed
// to another workload until those close).
type PortsRecord struct {
	Set     *ports.Set          `json:"set"`
	IDs     map[string]uint32   `json:"ids"`
	Retired map[string]uint32   `json:"retired,omitempty"`
	Cgroups map[string][]Target `json:"cgroups"`
}

// PortsResult is what an apply did.
type PortsResult struct {
	Workloads    int           `json:"workloads"`
	VirtualPorts int           `json:"virtual_ports"`
	Cgroups      int           `json:"cgroups"`
	Hooked       int           `json:"hooked_cgroups"`
	Took         time.Duration `json:"took_ns"`
}

// ephemeralRange reads net.ipv4.ip_local_port_range (it governs IPv6 too).
func ephemeralRange() (ports.Range, error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return ports.Range{}, fmt.Errorf("reading the ephemeral port range: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return ports.Range{}, fmt.Errorf("reading the ephemeral port range: unexpected %q", b)
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return ports.Range{}, fmt.Errorf("reading the ephemeral port range: unexpected %q", b)
	}
	return ports.Range{Lo: lo, Hi: hi}, nil
}

// checkPools refuses pools the kernel also hands out as ephemeral ports:
// a connect could take a pool port and a bind given it would fail.
func checkPools(set *ports.Set) error {
	eph, err := ephemeralRange()
	if err != nil {
		return err
	}
	for _, w := range set.Workloads {
		if w.Pool.Lo <= eph.Hi && eph.Lo <= w.Pool.Hi {
			return fmt.Errorf("workload %s: pool %s overlaps the kernel's ephemeral ports %s (net.ipv4.ip_local_port_range): choose a pool outside them, or narrow that range", w.Name, w.Pool, eph)
		}
	}
	return nil
}

// resolveWorkloads finds every workload's cgroups.
func resolveWorkloads(ctx context.Context, set *ports.Set, criSocket string) (map[string][]Target, error) {
	out := map[string][]Target{}
	for _, w := range set.Workloads {
		sel := Selection{Cgroup: w.Cgroup, PID: w.PID, Pod: w.Pod, Container: w.Container, Selector: w.Selector, CRISocket: criSocket}
		ts, err := sel.Targets(ctx)
		if err != nil {
			return nil, fmt.Errorf("workload %s: %w", w.Name, err)
		}
		out[w.Name] = ts
	}
	return out, nil
}

// portTargets is where the port hooks go: every workload cgroup and every
// cgroup the datapath is attached to (clients elsewhere), less those
// below another of them (a hook there runs already). None without rules.
func portTargets(dp *datapath.Datapath, cgs map[string][]Target) (map[uint64]string, error) {
	all := map[string]uint64{}
	for _, ts := range cgs {
		for _, t := range ts {
			all[t.Path] = t.ID
		}
	}
	if len(all) == 0 {
		return map[uint64]string{}, nil
	}
	atts, err := dp.Attachments()
	if err != nil {
		return nil, err
	}
	root, err := cgroups.Root()
	if err != nil {
		return nil, err
	}
	for _, a := range atts {
		p, err := cgroups.PathOf(root, a.CgroupID)
		if err != nil {
			continue // a cgroup gone: its links went with it
		}
		all[p] = a.CgroupID
	}
	out := map[uint64]string{}
	for p, id := range all {
		covered := false
		for q := range all {
			if q != p && strings.HasPrefix(p, strings.TrimSuffix(q, "/")+"/") {
				covered = true
				break
			}
		}
		if !covered {
			out[id] = p
		}
	}
	return out, nil
}

// ApplyPorts programs the port virtualization with a validated set: its
// pools checked against the kernel's ephemeral ports, its workloads
// resolved and the tables checked against the maps' sizes before anything
// changes. Sockets bound already keep their real ports.
func ApplyPorts(ctx context.Context, dp *datapath.Datapath, name string, set *ports.Set, criSocket string) (PortsResult, error) {
	start := time.Now()
	if err := checkPools(set); err != nil {
		return PortsResult{}, err
	}
	cgs, err := resolveWorkloads(ctx, set, criSocket)
	if err != nil {
		return PortsResult{}, err
	}
	dir, err := privateStateDir(name)
	if err != nil {
		return PortsResult{}, err
	}
	unlock, err := lockFile(filepath.Join(dir, "ports.lock"))
	if err != nil {
		return PortsResult{}, err
	}
	defer unlock()
	prev, err := readPortsRecord(name)
	if err != nil {
		return PortsResult{}, err
	}
	// Ids of workloads gone whose ports sockets still hold stay taken.
	claims, err := dp.PortClaims()
	if err != nil {
		return PortsResult{}, err
	}
	live := map[uint32]bool{}
	for _, c := range claims {
		if c.Sockets > 0 {
			live[c.Workload] = true
		}
	}
	taken := map[string]uint32{}
	retired := map[string]uint32{}
	for n, id := range prev.IDs {
		taken[n] = id
	}
	for n, id := range prev.Retired {
		if _, again := taken[n]; !again {
			taken[n] = id
		}
	}
	for n, id := range taken {
		if set.Workload(n) == nil && live[id] {
			retired[n] = id
		}
	}
	keep := map[string]uint32{}
	for n, id := range taken {
		if set.Workload(n) != nil || retired[n] != 0 {
			keep[n] = id
		}
	}
	ids := ports.AssignIDs(set, keep)
	root, err := cgroups.Root()
	if err != nil {
		return PortsResult{}, err
	}
	cgIDs := map[string][]ports.Cgroup{}
	nCg := 0
	for n, ts := range cgs {
		for _, t := range ts {
			rel, err := filepath.Rel(root, t.Path)
			if err != nil {
				return PortsResult{}, fmt.Errorf("workload %s: cgroup %s: %w", n, t.Path, err)
			}
			level := uint32(0)
			if rel != "." {
				level = uint32(strings.Count(rel, "/") + 1)
			}
			cgIDs[n] = append(cgIDs[n], ports.Cgroup{ID: t.ID, Level: level})
			nCg++
		}
	}
	addrs, err := hostAddrs()
	if err != nil {
		return PortsResult{}, err
	}
	own := map[netip.Addr]bool{}
	for _, a := range addrs {
		own[a] = true
	}
	for _, w := range set.Workloads {
		for _, a := range w.Addresses {
			if own[a] {
				return PortsResult{}, fmt.Errorf("workload %s: address %s is this node's own: give the workload an address no interface has", w.Name, a)
			}
		}
	}
	t := ports.Compile(set, ids, cgIDs, addrs)
	if t.Native, err = nativeListeners(set, ids, cgs); err != nil {
		return PortsResult{}, err
	}
	pools := map[string]int{}
	for _, w := range set.Workloads {
		pools[w.Name] = w.Pool.Len()
	}
	if err := datapath.CheckPortBudget(t, pools); err != nil {
		return PortsResult{}, err
	}
	hooks, err := portTargets(dp, cgs)
	if err != nil {
		return PortsResult{}, err
	}
	if err := dp.ApplyPorts(t); err != nil {
		return PortsResult{}, fmt.Errorf("applying port rules: %w", err)
	}
	udp := false
	for _, w := range set.Workloads {
		for _, p := range w.Ports {
			udp = udp || p.Protocol == "UDP"
		}
	}
	if err := dp.SetPortTargets(hooks, udp); err != nil {
		return PortsResult{}, err
	}
	rec := PortsRecord{Set: set, IDs: ids, Retired: retired, Cgroups: cgs}
	if err := writeJSONFile(filepath.Join(dir, portsFile), rec); err != nil {
		return PortsResult{}, fmt.Errorf("recording port rules: %w", err)
	}
	return PortsResult{Workloads: len(set.Workloads), VirtualPorts: len(t.VPorts), Cgroups: nCg,
		Hooked: len(hooks), Took: time.Since(start)}, nil
}

// readPortsRecord reads the last apply's record (empty if none).
func readPortsRecord(name string) (*PortsRecord, error) {
	rec := &PortsRecord{Set: &ports.Set{}, IDs: map[string]uint32{}}
	b, err := os.ReadFile(filepath.Join(StateDir(name), portsFile))
	if errors.Is(err, os.ErrNotExist) {
		return rec, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading applied port rules: %w", err)
	}
	if err := json.Unmarshal(b, rec); err != nil {
		return nil, fmt.Errorf("reading applied port rules: %w", err)
	}
	return rec, nil
}

// AppliedPorts is the last applied port rules with workload ids.
func AppliedPorts(name string) (*PortsRecord, error) { return readPortsRecord(name) }

// WorkloadNames maps workload ids (current and retired) to names.
func (r *PortsRecord) WorkloadNames() map[uint32]string {
	out := map[uint32]string{}
	for n, id := range r.Retired {
		out[id] = n
	}
	for n, id := range r.IDs {
		out[id] = n
	}
	return out
}

// PortCgroupsChanged reports whether set's workloads resolve to other
// cgroups than the last apply recorded.
func PortCgroupsChanged(ctx context.Context, name string, set *ports.Set, criSocket string) (bool, error) {
	rec, err := readPortsRecord(name)
	if err != nil {
		return false, err
	}
	cgs, err := resolveWorkloads(ctx, set, criSocket)
	if err != nil {
		return false, err
	}
	for _, w := range set.Workloads {
		a, b := cgs[w.Name], rec.Cgroups[w.Name]
		if len(a) != len(b) {
			return true, nil
		}
		ids := map[uint64]bool{}
		for _, t := range b {
			ids[t.ID] = true
		}
		for _, t := range a {
			if !ids[t.ID] {
				return true, nil
			}
		}
	}
	return false, nil
}

// claimGrace is how old a claim must be before the sweep may release it:
// a bind's claim is made just before the kernel binds the socket.
const claimGrace = 5 * time.Second

// SweepPortClaims releases real ports held in the pools that no socket of
// this network namespace is bound to any more (sockets whose release ran
// no program: an MPTCP listener's TCP subflow). Returns how many.
func SweepPortClaims(dp *datapath.Datapath) (int, error) {
	claims, err := dp.PortClaims()
	if err != nil {
		return 0, err
	}
	var held []datapath.PortClaim
	for _, c := range claims {
		if c.Sockets > 0 && c.Age > claimGrace {
			held = append(held, c)
		}
	}
	if len(held) == 0 {
		return 0, nil
	}
	conn, err := sockdiag.Open()
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	netns, err := conn.NetnsCookie()
	if err != nil {
		return 0, err
	}
	bound := map[string]bool{}
	for _, proto := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
		for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
			socks, err := conn.Dump(family, proto)
			if err != nil {
				return 0, err
			}
			for _, s := range socks {
				bound[fmt.Sprintf("%d/%s", s.ID.SrcPort, ports.ProtoName(proto))] = true
			}
		}
	}
	n := 0
	for _, c := range held {
		if c.NetNS != netns || bound[fmt.Sprintf("%d/%s", c.Real, c.Proto)] {
			continue
		}
		if err := dp.ReleasePortClaim(c); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// nativeListeners finds the programs of the workloads that listen on one
// of their virtual TCP ports already (started before the rule): left
// alone, they stay their workload's binding for that port.
func nativeListeners(set *ports.Set, ids map[string]uint32, cgs map[string][]Target) (map[ports.VKey]bool, error) {
	out := map[ports.VKey]bool{}
	for _, w := range set.Workloads {
		for _, t := range cgs[w.Name] {
			ls, err := procsock.InCgroup(t.Path)
			if err != nil {
				return nil, fmt.Errorf("workload %s: listing its listeners: %w", w.Name, err)
			}
			for _, l := range ls {
				if w.Has(int(l.Port), "TCP") {
					out[ports.VKey{Workload: ids[w.Name], Port: l.Port, Proto: ports.ProtoTCP}] = true
				}
			}
		}
	}
	return out, nil
}
