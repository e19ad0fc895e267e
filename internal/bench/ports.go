package bench

import (
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
	"github.com/socklane/socklane/internal/peer"
	"github.com/socklane/socklane/internal/ports"
	"github.com/socklane/socklane/internal/sockdiag"
)

// Ports measures port virtualization: bind and connect as a program in
// the node's network namespace does them, with no rules (the hooks not
// attached), under N workload rules as a bystander (the program in none of
// them, the hooks on its cgroup: what every other program of the node
// pays), and as one of the N workloads (its binds draw real ports from a
// pool, its connects to its virtual port reach its own binding).
const Ports = "ports"

// Paths of the ports measurement.
const (
	PathNoPortRules = "no-rules"
	PathBystander   = "bystander"
	PathPortRules   = "workload"
)

// MaxPortRules is the most workloads the benchmark programs.
const MaxPortRules = 4000

// Virtual ports the measured workload binds and connects to, and the
// real ports its pool draws from (outside every ephemeral range).
const (
	benchBindPort    = 3101
	benchConnectPort = 3100
	benchPoolLo      = 22000
)

func checkPorts(o Options) error {
	if len(o.PortRuleCounts) == 0 {
		return errors.New("--port-rule-counts: give at least one number of rules")
	}
	for _, n := range o.PortRuleCounts {
		if n < 1 || n > MaxPortRules {
			return fmt.Errorf("--port-rule-counts %d: want 1 to %d", n, MaxPortRules)
		}
	}
	return nil
}

// portRules are n workloads with the same virtual ports, pools of their
// own: the host pod's and n-1 in cgroups of their own, or (bystander) n in
// cgroups of their own.
func (r *runner) portRules(n int, bystander bool) (*ports.Tables, func(), error) {
	dir := filepath.Dir(r.host.Cgroup)
	set := &ports.Set{}
	cgs := map[string][]ports.Cgroup{}
	// The bench's cgroups are at one level: the host pod's.
	root, err := cgroups.Root()
	if err != nil {
		return nil, nil, err
	}
	rel, err := filepath.Rel(root, r.host.Cgroup)
	if err != nil {
		return nil, nil, err
	}
	level := uint32(strings.Count(rel, "/") + 1)
	var made []string
	cleanup := func() {
		for _, d := range made {
			_ = os.Remove(d)
		}
	}
	virtual := []ports.Port{{Port: ports.Range{Lo: benchConnectPort, Hi: benchBindPort}, Protocol: "TCP"}}
	for i := range n {
		name := fmt.Sprintf("w-%d", i)
		pool := ports.Range{Lo: benchPoolLo + 2*i, Hi: benchPoolLo + 2*i + 1}
		if i == 0 && !bystander {
			cgs[name] = []ports.Cgroup{{ID: r.host.CgroupID, Level: level}}
			pool = ports.Range{Lo: benchPoolLo - 100, Hi: benchPoolLo - 1}
		} else {
			d := filepath.Join(dir, "bench-port-"+strconv.Itoa(i))
			if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				cleanup()
				return nil, nil, fmt.Errorf("creating a filler cgroup: %w", err)
			}
			made = append(made, d)
			id, err := cgroups.ID(d)
			if err != nil {
				cleanup()
				return nil, nil, err
			}
			cgs[name] = []ports.Cgroup{{ID: id, Level: level}}
		}
		zero := 0
		set.Workloads = append(set.Workloads, &ports.Workload{Name: name, Cgroup: "-", Ports: virtual, Pool: pool, ReuseAfter: &zero})
	}
	ids := ports.AssignIDs(set, nil)
	return ports.Compile(set, ids, cgs, nil), cleanup, nil
}

// measurePorts times binds, then connects (64 B echoed, as the connect
// measurement), by a program of the host pod, with the rules programmed
// and hooked or none; the port counters prove which it was.
func (r *runner) measurePorts(c *Case, path string) (Sample, error) {
	var s Sample
	// Earlier runs' TIME_WAIT sockets towards the measured ports, in the
	// node's namespace, would make this run's connects search past them.
	if !r.noDestroy {
		conn, err := sockdiag.Open()
		if err != nil {
			return s, err
		}
		_, err = conn.DestroyTimeWait(func(a netip.AddrPort) bool {
			p := a.Port()
			return a.Addr().Unmap().IsLoopback() && (p == benchConnectPort || (p >= benchPoolLo-100 && p < benchPoolLo))
		})
		conn.Close()
		if errors.Is(err, sockdiag.ErrNoDestroy) {
			r.noDestroy = true
		} else if err != nil {
			return s, fmt.Errorf("clearing TIME_WAIT sockets: %w", err)
		}
	}
	if path != PathNoPortRules {
		t, cleanup, err := r.portRules(c.Size, path == PathBystander)
		if err != nil {
			return s, err
		}
		defer cleanup()
		start := time.Now()
		if err := r.dp.ApplyPorts(t); err != nil {
			return s, err
		}
		if err := r.dp.SetPortTargets(map[uint64]string{r.host.CgroupID: r.host.Cgroup}, false); err != nil {
			return s, err
		}
		s.ProgramMs = float64(time.Since(start).Microseconds()) / 1000
		defer func() {
			_ = r.dp.SetPortTargets(nil, false)
			_ = r.dp.ApplyPorts(&ports.Tables{Cgroups: map[uint64]uint32{}, VPorts: map[ports.VKey]ports.Rule{}, Index: map[ports.PKey]uint32{}})
		}()
	}
	before, err := r.dp.PortStats()
	if err != nil {
		return s, err
	}
	cpu := r.clientCPU(c)
	out, err := r.run(r.host, cpu, r.self, "peer", "bindloop", fmt.Sprintf("127.0.0.1:%d", benchBindPort), "--count", strconv.Itoa(r.o.Connects))
	if err != nil {
		return s, err
	}
	var bl peer.Latency
	if err := json.Unmarshal(out, &bl); err != nil {
		return s, fmt.Errorf("parsing %q: %w", out, err)
	}
	s.BindUs = bl.Mean
	// The server binds its port as the program would: virtual with the
	// rules, the port itself without.
	srv, err := r.host.Command("taskset", "-c", strconv.Itoa(cpu), r.self, "peer", "echo", fmt.Sprintf("127.0.0.1:%d", benchConnectPort), "--io", string(r.o.IO))
	if err != nil {
		return s, err
	}
	if err := srv.Start(); err != nil {
		return s, err
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	target := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), benchConnectPort).String()
	// Ready once a connect from the pod (where the rules apply) gets
	// its echo.
	for i := 0; ; i++ {
		if _, err := r.run(r.host, cpu, r.self, "peer", "connects", target, "--size", "64", "--count", "1"); err == nil {
			break
		} else if i == 100 {
			return s, fmt.Errorf("the echo server at %s never answered: %w", target, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var l peer.Latency
	out, err = r.run(r.host, cpu, r.self, "peer", "connects", target, "--size", "64", "--count", strconv.Itoa(r.o.Connects), "--io", string(r.o.IO))
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(out, &l); err != nil {
		return s, fmt.Errorf("parsing %q: %w", out, err)
	}
	s.setLatency(l)
	after, err := r.dp.PortStats()
	if err != nil {
		return s, err
	}
	var binds, connects uint64
	for id, m := range after {
		binds += m["binds"] - before[id]["binds"]
		connects += m["connects"] - before[id]["connects"]
	}
	switch {
	case path == PathPortRules && (binds < uint64(r.o.Connects) || connects < uint64(r.o.Connects)):
		return s, fmt.Errorf("%d binds and %d connects virtualized for %d of each under %d rules", binds, connects, r.o.Connects, c.Size)
	case path != PathPortRules && (binds != 0 || connects != 0):
		return s, fmt.Errorf("%d binds and %d connects virtualized on the %s path", binds, connects, path)
	}
	return s, nil
}
