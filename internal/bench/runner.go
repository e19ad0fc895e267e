package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/socklane/socklane/internal/bench/bare"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/peer"
	"github.com/socklane/socklane/internal/sockdiag"
	"github.com/socklane/socklane/internal/testbed"
)

// serverAddrs is where the servers of one placement and kind listen.
type serverAddrs struct {
	placement, kind string
	port            uint16
	unix            string
}

// runner measures a bench run's cases: it holds the pods, the servers
// pinned to their CPUs, the datapath, and runs each case's clients on
// each path, checking the kernel's counters around every sample.
type runner struct {
	o              Options
	self           string
	client, server *testbed.Pod
	host           *testbed.Pod
	dp             *datapath.Datapath
	bare           *bare.Path // the reference path, attached for its samples only
	ctx            context.Context
	servers        []*exec.Cmd
	addrs          []serverAddrs
	backends       []netip.Addr // service backends: the server's two addresses
	noDestroy      bool         // the kernel cannot destroy sockets: TIME_WAIT stays
	dir            string       // the run's files (AF_UNIX sockets, programs' files)
}

// clearTimeWait removes the TIME_WAIT sockets that earlier short-connection
// runs left in pod's namespace, so that every run starts alike: a run whose
// connections go where another path's just went otherwise searches past
// their TIME_WAIT sockets for a free port (10,000 connections each on four
// paths to one backend took 4 ms per connect by the last). In the node's
// own namespace only sockets towards the bench's pods and services are
// touched.
func (r *runner) clearTimeWait(pod *testbed.Pod) error {
	if r.noDestroy {
		return nil
	}
	var c *sockdiag.Conn
	var err error
	match := func(netip.AddrPort) bool { return true }
	if pod.NetNS == "" {
		c, err = sockdiag.Open()
		ours := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, 0, 0}), 15)
		match = func(a netip.AddrPort) bool { return ours.Contains(a.Addr().Unmap()) }
	} else {
		c, err = sockdiag.OpenIn(pod.NetNS)
	}
	if err != nil {
		return fmt.Errorf("clearing TIME_WAIT sockets: %w", err)
	}
	defer c.Close()
	_, err = c.DestroyTimeWait(match)
	if errors.Is(err, sockdiag.ErrNoDestroy) {
		r.noDestroy = true
		r.o.Log.Warn("TIME_WAIT sockets of earlier runs stay: short-connection runs that follow others to the same address pay for them", "error", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("clearing TIME_WAIT sockets: %w", err)
	}
	return nil
}

func (r *runner) startServer(cpu int, kind, listen string) error {
	return r.startPinned(cpu, kind, r.self, "peer", kind, listen, "--io", string(r.o.IO))
}

// startPinned starts a long-running server in the server pod on cpu.
func (r *runner) startPinned(cpu int, what, name string, args ...string) error {
	cmd, err := r.server.Command("taskset", append([]string{"-c", strconv.Itoa(cpu), name}, args...)...)
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s server: %w", what, err)
	}
	r.servers = append(r.servers, cmd)
	return nil
}

// stopServers asks every server to stop (postgres and nginx end their
// children that way), then kills what has not within five seconds.
func (r *runner) stopServers() {
	for _, c := range r.servers {
		_ = c.Process.Signal(stopSignal)
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, c := range r.servers {
		done := make(chan struct{})
		go func() {
			_ = c.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(time.Until(deadline)):
			_ = c.Process.Kill()
			<-done
		}
	}
}

func (r *runner) cases() []*Case {
	var cs []*Case
	add := func(kind string, size int) {
		for _, sc := range r.o.Scenarios {
			for _, p := range r.o.Placements {
				cs = append(cs, &Case{Kind: kind, Size: size, Placement: p.Name, Scenario: sc, Samples: map[string][]Sample{},
					Control: r.o.Control && (kind == Latency || kind == Throughput)})
			}
		}
	}
	for _, k := range r.o.Kinds {
		switch k {
		case Latency, Throughput:
			for _, s := range r.o.Sizes {
				add(k, s)
			}
		case Echo:
			add(k, 1024)
		case Connect:
			add(k, 64)
		case Policies:
			for _, n := range r.o.PolicyCounts {
				for _, p := range r.o.Placements {
					cs = append(cs, &Case{Kind: k, Size: n, Placement: p.Name, Scenario: PodToPod, Samples: map[string][]Sample{}})
				}
			}
		case Ports:
			for _, n := range r.o.PortRuleCounts {
				for _, p := range r.o.Placements {
					cs = append(cs, &Case{Kind: k, Size: n, Placement: p.Name, Scenario: Loopback, Samples: map[string][]Sample{}})
				}
			}
		case Services:
			for _, n := range r.o.ServiceCounts {
				for _, p := range r.o.Placements {
					cs = append(cs, &Case{Kind: k, Size: n, Placement: p.Name, Scenario: PodToPod, Samples: map[string][]Sample{},
						NoBaseline: n > r.o.IptablesMaxServices})
				}
			}
		}
	}
	return append(cs, r.toolCases()...)
}

// clientPod is where the scenario's client runs.
func (r *runner) clientPod(c *Case) *testbed.Pod {
	switch c.Scenario {
	case Loopback:
		return r.server
	case HostToPod:
		return r.host
	}
	return r.client
}

// addrPort is the port of the echo server of the case's placement.
func (r *runner) addrPort(c *Case) uint16 {
	for _, a := range r.addrs {
		if a.placement == c.Placement && a.kind == "echo" {
			return a.port
		}
	}
	return 0
}

func (r *runner) addr(c *Case, path string) string {
	kind := "echo"
	if c.Kind == Throughput {
		kind = "sink"
	}
	for _, a := range r.addrs {
		if a.placement == c.Placement && a.kind == kind {
			if path == PathUnix {
				return a.unix
			}
			ip := r.server.IPv4
			if c.Scenario == Loopback {
				ip = netip.AddrFrom4([4]byte{127, 0, 0, 1})
			}
			return netip.AddrPortFrom(ip, a.port).String()
		}
	}
	return ""
}

func (r *runner) clientCPU(c *Case) int {
	for _, p := range r.o.Placements {
		if p.Name == c.Placement {
			return p.ClientCPU
		}
	}
	return 0
}

// measure runs one case over one path and checks, from the datapath's
// counters, that the bytes took that path.
func (r *runner) measure(c *Case, path string) (Sample, error) {
	if c.Kind == Connect || c.Kind == Services || c.Kind == Policies {
		if err := r.clearTimeWait(r.clientPod(c)); err != nil {
			return Sample{}, err
		}
	}
	if c.Kind == Services {
		return r.measureServices(c, path)
	}
	if c.Kind == Policies {
		return r.measurePolicies(c, path)
	}
	if c.Kind == Ports {
		return r.measurePorts(c, path)
	}
	pods := []*testbed.Pod{r.client, r.server, r.host}
	if path == PathBypass {
		for _, p := range pods {
			if _, err := r.dp.Attach(p.Cgroup, p.CgroupID); err != nil {
				return Sample{}, err
			}
		}
	} else if _, err := r.dp.DetachAll(); err != nil {
		return Sample{}, err
	}
	bared := path == PathBare || path == PathBareAgain
	if bared {
		for _, p := range pods {
			if err := r.bare.Attach(p.Cgroup); err != nil {
				return Sample{}, errors.Join(err, r.bare.Detach())
			}
		}
		defer func() { _ = r.bare.Detach() }()
	}
	before, err := r.dp.Counters()
	if err != nil {
		return Sample{}, err
	}
	bareBefore, err := r.bare.Counts()
	if err != nil {
		return Sample{}, err
	}
	var s Sample
	if c.Tool != "" {
		s, err = r.measureTool(c)
	} else {
		s, err = r.measurePeer(c, path)
	}
	if err != nil {
		return s, err
	}
	after, err := r.dp.Counters()
	if err != nil {
		return s, err
	}
	bareAfter, err := r.bare.Counts()
	if err != nil {
		return s, err
	}
	d := after.Since(before)
	ours := d.Get(datapath.CounterRedirectMsgs)
	theirs := bareAfter.Redirected - bareBefore.Redirected
	s.BacklogFallbacks = d.Get(datapath.CounterFallbackBacklog)
	s.StreamFallbacks = d.Get(datapath.CounterFallbackSmall)
	s.ValveOpens, s.ValveBytes = d.Get(datapath.CounterValveOpens), d.Get(datapath.CounterValveBytes)
	s.LateVerdicts = d.Get(datapath.CounterLateVerdicts)
	s.RedirectedBytes = d.Get(datapath.CounterRedirectBytes)
	s.Redirected = ours
	if bared {
		s.Redirected, s.BareMissed = theirs, bareAfter.Missed-bareBefore.Missed
	}
	switch {
	case path == PathBypass && ours == 0 && r.o.DefaultSettings:
		s.KeptOnTCP = keptOnTCP(d.Map())
	case path == PathBypass && ours == 0:
		return s, errors.New("bypass attached, yet no message was redirected")
	case path != PathBypass && ours != 0:
		return s, fmt.Errorf("bypass detached, yet %d messages were redirected", ours)
	case bared && theirs == 0:
		return s, fmt.Errorf("bare redirect attached, yet no message was redirected (%d sends found no peer; %d sockets joined, %d refused)",
			s.BareMissed, bareAfter.Joined-bareBefore.Joined, bareAfter.JoinFailed-bareBefore.JoinFailed)
	case !bared && theirs != 0:
		return s, fmt.Errorf("bare redirect detached, yet it redirected %d messages", theirs)
	}
	return s, nil
}

// measurePeer runs socklane's own client against its own server.
func (r *runner) measurePeer(c *Case, path string) (Sample, error) {
	addr := r.addr(c, path)
	var args []string
	switch c.Kind {
	case Latency:
		args = []string{"pingpong", addr, "--size", strconv.Itoa(c.Size), "--count", strconv.Itoa(r.o.Count), "--warmup", strconv.Itoa(min(1000, r.o.Count/10+1))}
	case Echo:
		args = []string{"pingpong", addr, "--size", "1024", "--count", strconv.Itoa(r.o.EchoCount), "--warmup", "0"}
	case Connect:
		args = []string{"connects", addr, "--size", "64", "--count", strconv.Itoa(r.o.Connects)}
	case Throughput:
		args = []string{"stream", addr, "--size", strconv.Itoa(c.Size), "--count", "0", "--duration", r.o.Duration.String()}
	}
	args = append([]string{r.self, "peer"}, append(args, "--io", string(r.o.IO))...)
	var s Sample
	if c.Kind == Throughput {
		var tp peer.Throughput
		err := r.runJSON(r.clientPod(c), c, &tp, args...)
		s.MBps, s.MsgRate = tp.MBps, tp.MsgRate
		return s, err
	}
	var l peer.Latency
	err := r.runJSON(r.clientPod(c), c, &l, args...)
	s.setLatency(l)
	return s, err
}

// setLatency takes a latency run's figures (round trips, us).
func (s *Sample) setLatency(l peer.Latency) {
	s.Mean, s.P50, s.P99, s.P999, s.Max = l.Mean, l.P50, l.P99, l.P999, l.Max
}

// runJSON runs a client command in pod on the case's client CPU and
// decodes what it prints into v.
func (r *runner) runJSON(pod *testbed.Pod, c *Case, v any, args ...string) error {
	out, err := r.run(pod, r.clientCPU(c), args...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("parsing %q: %w", out, err)
	}
	return nil
}

// run runs a client command in pod on cpu and returns its standard output.
func (r *runner) run(pod *testbed.Pod, cpu int, args ...string) ([]byte, error) {
	cmd, err := pod.Command("taskset", append([]string{"-c", strconv.Itoa(cpu)}, args...)...)
	if err != nil {
		return nil, err
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	ctx, cancel := context.WithTimeout(r.ctx, 10*time.Minute)
	defer cancel()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return nil, fmt.Errorf("%v: %w: %s", args, err, errb.String())
		}
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("%v: %w (%v)", args, ctx.Err(), <-done)
	}
	return out.Bytes(), nil
}

func progress(w io.Writer, done, total int, c *Case, path string) {
	if w == nil {
		return
	}
	const width = 30
	n := done * width / total
	bar := bytes.Repeat([]byte("#"), n)
	bar = append(bar, bytes.Repeat([]byte("."), width-n)...)
	kind, unit := c.Kind, "B"
	if c.Tool != "" {
		kind = c.Tool + " " + kind
	}
	if c.Kind == Services {
		unit = "svc"
	}
	if c.Kind == Policies {
		unit = "pol"
	}
	if c.Kind == Ports {
		unit = "wl"
	}
	fmt.Fprintf(w, "\r[%s] %3d%% %-19s %6d %-3s %-11s %-9s %-11s", bar, done*100/total, kind, c.Size, unit, c.Scenario, c.Placement, path)
}

// keptOnTCP names the fallback counter that moved most in d (the counters'
// changes over a sample), without its prefix: why the sample's
// connections stayed on TCP.
func keptOnTCP(d map[string]uint64) string {
	best, n := "", uint64(0)
	for name, v := range d {
		if reason, ok := strings.CutPrefix(name, "fallback_"); ok && (v > n || v == n && reason < best) {
			best, n = reason, v
		}
	}
	if best == "" {
		return "unknown"
	}
	return best
}
