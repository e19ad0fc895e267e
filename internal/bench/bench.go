// Package bench measures what the bypass buys on this node: the seed
// articles' measurements (ping-pong latency, stream throughput, the
// tcp-bypasser 1 KiB echo, short connections) run between two pods with the
// bypass off and on, interleaved and repeated, beside an AF_UNIX reference
// between the same two pods' processes.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/bench/bare"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/peer"
	"github.com/socklane/socklane/internal/testbed"
	"golang.org/x/sys/unix"
)

// Kinds of measurement.
const (
	Latency    = "latency"    // ping-pong round trips per size
	Throughput = "throughput" // one-way stream per size
	Echo       = "echo"       // tcp-bypasser: echoed 1 KiB requests
	Connect    = "connect"    // connect + one request + close
)

// Kinds lists every measurement.
func Kinds() []string { return []string{Latency, Throughput, Echo, Connect, Services, Policies} }

// Paths compared in every measurement.
const (
	PathTCP    = "tcp"    // bypass detached: the kernel's TCP/IP stack
	PathBypass = "bypass" // socklane attached
	PathUnix   = "unix"   // AF_UNIX stream socket, same processes' pods
	// PathBare is the reference: the bare sockmap redirect (package
	// bare: sock_ops + sk_msg, nothing else), socklane detached.
	PathBare = "bare"
	// PathBareAgain is the bare redirect measured a second time in the
	// same repetition (--control): bare-again / bare is what the machine
	// itself moves between two runs of one path, the floor under any
	// bypass / bare ratio the same run reports.
	PathBareAgain = "bare-again"
)

// Scenarios: where the client runs relative to the server.
const (
	PodToPod  = "pod-to-pod"  // two pods over the node bridge (bridge-nf on)
	Loopback  = "loopback"    // client and server in one pod, over 127.0.0.1
	HostToPod = "host-to-pod" // a host-network process to a pod
)

// ScenarioText describes each scenario in reports.
var scenarioText = map[string]string{
	PodToPod:  "pod to pod over the node bridge (bridge-nf on), IPv4",
	Loopback:  "loopback inside one pod (127.0.0.1)",
	HostToPod: "host network namespace to a pod over the bridge, IPv4",
}

// Scenarios lists every scenario in report order.
func Scenarios() []string { return []string{PodToPod, Loopback, HostToPod} }

// Placement of client and server.
type Placement struct {
	Name      string `json:"name"`
	ClientCPU int    `json:"client_cpu"`
	ServerCPU int    `json:"server_cpu"`
}

// Options of a benchmark run.
type Options struct {
	BPFFS      string
	Reps       int           // interleaved repetitions
	Sizes      []int         // message sizes
	Count      int           // round trips per latency run
	Duration   time.Duration // per throughput run
	EchoCount  int           // echoed requests (tcp-bypasser: 250000)
	Connects   int           // short connections per run
	Kinds      []string      // which measurements
	Placements []Placement
	Scenarios  []string
	// External tools (qperf, sockperf, iperf3) run pod to pod beside
	// socklane's own peers, at ToolSizes, each run ToolDuration long.
	Tools        []string
	ToolSizes    []int
	ToolDuration time.Duration
	// ServiceCounts are the numbers of services of the services
	// measurement (kube-proxy iptables rules against socklane).
	ServiceCounts []int
	// IptablesMaxServices is the most services the iptables baseline is
	// programmed with (iptables-restore takes about 90 s for 10,000 here
	// and grows faster than N); larger counts measure socklane alone.
	IptablesMaxServices int
	// PolicyCounts are the numbers of policies of the policies
	// measurement.
	PolicyCounts []int
	// PortRuleCounts are the numbers of workload rules of the ports
	// measurement.
	PortRuleCounts []int
	// VerdictWindow is the datapath's verdict window (see datapath.Config).
	VerdictWindow uint32
	// IO is how socklane's own clients and servers drive their sockets.
	IO peer.IO
	// BypassBrief joins every connection to the bypass, brief ones too
	// (see datapath.Config).
	BypassBrief bool
	// BypassSmallStreams keeps fast one-way streams of small sends in the
	// bypass (by default they move to TCP: see datapath.Config).
	BypassSmallStreams bool
	// SlowReadersTCP moves a direction whose reader falls behind to TCP
	// for good instead of pushing its writer back through TCP (the valve,
	// the default where the kernel runs it: see datapath.Settings).
	SlowReadersTCP bool
	// LateVerdict gives readers the valve's verdict only when they fall
	// behind (the datapath's --reader-verdict late).
	LateVerdict bool
	// BareStreamVerdict gives the bare redirect a pass-through sk_skb
	// stream verdict, as the valve gives socklane's map: both then read
	// through the kernel's parser receive path (bare.Options).
	BareStreamVerdict bool
	// Control measures the bare redirect twice in every repetition of
	// socklane's own latency and throughput cases (PathBareAgain).
	Control bool
	// DefaultSettings loads the datapath as the agent does by default
	// (blocking readers decided per process, as the kernel's bugs say)
	// instead of bypassing every connection: each bypass sample then
	// records the path its connections took, and why.
	DefaultSettings bool
	// BPFStats turns on the kernel's BPF run-time statistics for the run
	// and reports each program's cost. They cost two clock reads per
	// program run, which a short connection's dozen runs notice.
	BPFStats bool
	Progress io.Writer // progress line (nil: none)
	Log      *slog.Logger
}

// DefaultPlacements pins both ends to one CPU, then to two.
func DefaultPlacements() []Placement {
	return []Placement{{"same-cpu", 0, 0}, {"cross-cpu", 0, 1}}
}

// Sample is one run of one path.
type Sample struct {
	Mean, P50, P99, P999, Max float64 // microseconds (latency kinds)
	MBps, MsgRate             float64 // throughput
	Redirected                uint64  // messages the path's datapath (socklane's, or the bare redirect) redirected during the run
	ProgramMs                 float64 `json:",omitempty"` // services: time to program them
	BindUs                    float64 `json:",omitempty"` // ports: mean socket + bind + close, microseconds
	// BacklogFallbacks: bypassed directions that moved to TCP during the
	// run because their receiver fell behind (fallback_backlog).
	BacklogFallbacks uint64 `json:",omitempty"`
	// StreamFallbacks: bypassed directions that moved to TCP during the
	// run as fast one-way streams of small sends (fallback_small_stream).
	StreamFallbacks uint64 `json:",omitempty"`
	// ValveOpens and ValveBytes: how often the valve pushed a writer
	// back through TCP during the run, and the bytes it passed there;
	// RedirectedBytes: the bytes redirected (socklane's path).
	ValveOpens      uint64 `json:",omitempty"`
	ValveBytes      uint64 `json:",omitempty"`
	RedirectedBytes uint64 `json:",omitempty"`
	// LateVerdicts: readers of the run given the valve's verdict when
	// their writer first found them behind (late_verdicts, --reader-verdict
	// late).
	LateVerdicts uint64 `json:",omitempty"`
	// KeptOnTCP: with --default-settings, why a bypass sample's
	// connections stayed on TCP (the largest fallback counter's name), if
	// nothing was redirected.
	KeptOnTCP string `json:",omitempty"`
	// BareMissed: sends of the bare path whose peer was not in its map
	// (they went over TCP).
	BareMissed uint64 `json:",omitempty"`
}

// Case is one measurement at one size and placement, all repetitions.
type Case struct {
	Kind      string              `json:"kind"`
	Tool      string              `json:"tool,omitempty"` // external tool; empty: socklane's own peers
	Size      int                 `json:"size"`
	Placement string              `json:"placement"`
	Scenario  string              `json:"scenario"`
	Samples   map[string][]Sample `json:"samples"`
	// NoBaseline: a services case above IptablesMaxServices, measured
	// without the iptables baseline.
	NoBaseline bool `json:"no_baseline,omitempty"`
	// Control: the bare redirect is measured twice (PathBareAgain).
	Control bool `json:"control,omitempty"`
}

// Paths the case is measured over: external tools have no AF_UNIX mode.
func (c *Case) Paths() []string {
	if c.Kind == Policies {
		return []string{PathNoPolicy, PathPolicies}
	}
	if c.Kind == Ports {
		return []string{PathNoPortRules, PathBystander, PathPortRules}
	}
	if c.Kind == Services {
		if c.NoBaseline {
			return []string{PathSockLB, PathDirect}
		}
		return []string{PathIptables, PathSockLB, PathDirect}
	}
	if c.Tool != "" {
		return []string{PathTCP, PathBypass, PathBare}
	}
	if c.Control {
		// The second bare run follows bare as bypass precedes it: in
		// every repetition (PathsOfRep reverses every other) each of
		// the two ratios' paths runs right next to bare.
		return []string{PathTCP, PathBypass, PathBare, PathBareAgain, PathUnix}
	}
	return []string{PathTCP, PathBypass, PathBare, PathUnix}
}

// PathsOfRep is the order of the case's paths in repetition rep: Paths,
// reversed in every other repetition, so that no path always runs right
// after another (a sample taken after a detach, or after the run that
// heats the caches the next one finds, would otherwise favour or handicap
// the same path in every ratio of a run; A B B A over two repetitions
// cancels what the position does).
func (c *Case) PathsOfRep(rep int) []string {
	paths := c.Paths()
	if rep%2 == 1 {
		slices.Reverse(paths)
	}
	return paths
}

// ProgStat is the kernel's run-time statistics of one program.
type ProgStat struct {
	Name  string  `json:"name"`
	Runs  uint64  `json:"runs"`
	NsRun float64 `json:"ns_per_run"`
}

// Report is the whole result.
type Report struct {
	Started time.Time `json:"started"`
	Kernel  string    `json:"kernel"`
	// Congestion is the host's TCP congestion control, which the pods'
	// namespaces inherit when created (and TCP's numbers depend on).
	Congestion string  `json:"congestion,omitempty"`
	CPUs       int     `json:"cpus"`
	Reps       int     `json:"reps"`
	IO         peer.IO `json:"io"`
	// BypassBrief: brief connections joined the bypass (--bypass-brief).
	BypassBrief bool `json:"bypass_brief,omitempty"`
	// BypassSmallStreams: streams of small sends stayed in the bypass
	// (--bypass-small-streams).
	BypassSmallStreams bool `json:"bypass_small_streams,omitempty"`
	// DefaultSettings: the datapath ran with the agent's defaults
	// (--default-settings).
	DefaultSettings bool `json:"default_settings,omitempty"`
	// BareStreamVerdict: the bare redirect had a stream verdict
	// (--bare-stream-verdict).
	BareStreamVerdict bool `json:"bare_stream_verdict,omitempty"`
	// Control: the bare redirect was measured twice (--control).
	Control bool `json:"control,omitempty"`
	// Settings are what socklane's datapath was loaded with (the
	// defaults resolved on this kernel, or the bench's own).
	Settings datapath.Settings `json:"settings"`
	// BPFStats: the kernel's BPF run-time statistics were on (Programs).
	BPFStats  bool              `json:"bpf_stats"`
	Scenarios map[string]string `json:"scenarios"`
	Cases     []*Case           `json:"cases"`
	Programs  []ProgStat        `json:"programs,omitempty"`
	// Sync is the state sync measurement, when asked for.
	Sync *SyncReport `json:"sync,omitempty"`
}

// Run sets up two pods, runs every case and returns the report.
func Run(ctx context.Context, o Options) (*Report, error) {
	if _, err := node.Preflight(o.BPFFS, nil); err != nil {
		return nil, err
	}
	if o.Reps < 1 || o.Count < 1 || len(o.Sizes) == 0 {
		return nil, errors.New("bench: need at least one repetition, one round trip and one size")
	}
	for _, k := range o.Kinds {
		if !slices.Contains(Kinds(), k) && k != Ports {
			return nil, fmt.Errorf("unknown measurement %q: want some of %v, %s", k, Kinds(), Ports)
		}
	}
	for _, sc := range o.Scenarios {
		if _, ok := scenarioText[sc]; !ok {
			return nil, fmt.Errorf("unknown scenario %q: want %v", sc, Scenarios())
		}
	}
	if _, err := peer.ParseIO(string(o.IO)); err != nil {
		return nil, err
	}
	if err := checkTools(o.Tools); err != nil {
		return nil, err
	}
	if slices.Contains(o.Kinds, Services) {
		if err := checkServices(o); err != nil {
			return nil, err
		}
	}
	if slices.Contains(o.Kinds, Policies) {
		if err := checkPolicies(o); err != nil {
			return nil, err
		}
	}
	if slices.Contains(o.Kinds, Ports) {
		if err := checkPorts(o); err != nil {
			return nil, err
		}
	}
	for _, p := range o.Placements {
		if p.ClientCPU >= cpus() || p.ServerCPU >= cpus() {
			return nil, fmt.Errorf("placement %s needs CPU %d, this machine has %d", p.Name, max(p.ClientCPU, p.ServerCPU), cpus())
		}
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding own executable: %w", err)
	}
	bed, client, server, err := clientServer()
	if err != nil {
		return nil, err
	}
	defer closeBed(bed, o.Log)
	host, err := bed.AddHostPod("host")
	if err != nil {
		return nil, err
	}
	pinDir := filepath.Join(o.BPFFS, "socklane-bench-"+strconv.Itoa(os.Getpid()))
	// Measured whatever the kernel's bugs; external tools, and socklane's
	// own peers with --io blocking, read in blocking mode.
	settings := datapath.DefaultSettings()
	settings.VerdictWindow = o.VerdictWindow
	if !o.DefaultSettings {
		settings.Bypass, settings.BypassBlocking = datapath.ModeOn, datapath.ModeOn
	}
	if o.BypassBrief {
		settings.BypassBrief = datapath.ModeOn
	}
	if o.BypassSmallStreams {
		settings.BypassSmallStreams = datapath.ModeOn
	}
	if o.SlowReadersTCP {
		settings.BacklogValve = datapath.ModeOff
	}
	if o.LateVerdict {
		settings.LateVerdict = datapath.ModeOn
	}
	dp, err := datapath.Open(datapath.Config{PinDir: pinDir, Settings: settings})
	if err != nil {
		return nil, err
	}
	defer func() {
		dp.Close()
		if _, err := node.Down(pinDir, true, 0, o.Log); err != nil {
			o.Log.Warn("removing bench datapath", "err", err)
		}
	}()
	sockDir, err := os.MkdirTemp("", "socklane-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(sockDir)

	ref, err := bare.Load(bare.Options{StreamVerdict: o.BareStreamVerdict})
	if err != nil {
		return nil, err
	}
	defer ref.Close()

	r := &runner{o: o, self: self, client: client, server: server, host: host, dp: dp, bare: ref, ctx: ctx, dir: sockDir}
	if slices.Contains(o.Kinds, Services) {
		if r.backends, err = serviceBackends(server); err != nil {
			return nil, err
		}
	}
	// One echo server and one sink per placement, TCP and AF_UNIX.
	for i, p := range o.Placements {
		for _, kind := range []string{"echo", "sink"} {
			port := 7000 + 10*i
			if kind == "sink" {
				port++
			}
			unixAddr := "unix:" + filepath.Join(sockDir, fmt.Sprintf("%s-%d.sock", kind, i))
			for _, listen := range []string{fmt.Sprintf("0.0.0.0:%d", port), unixAddr} {
				if err := r.startServer(p.ServerCPU, kind, listen); err != nil {
					return nil, err
				}
			}
			r.addrs = append(r.addrs, serverAddrs{placement: p.Name, kind: kind, port: uint16(port), unix: unixAddr})
		}
	}
	defer r.stopServers()
	if err := r.startToolServers(); err != nil {
		return nil, err
	}

	rep := &Report{Started: time.Now().UTC(), Kernel: kernel(), Congestion: congestion(), CPUs: cpus(), Reps: o.Reps, IO: o.IO, BypassBrief: o.BypassBrief,
		BypassSmallStreams: o.BypassSmallStreams, DefaultSettings: o.DefaultSettings, BareStreamVerdict: o.BareStreamVerdict, Control: o.Control, Scenarios: map[string]string{}}
	if rep.Settings, err = dp.Settings(); err != nil {
		return nil, fmt.Errorf("reading the datapath's settings: %w", err)
	}
	if o.BPFStats {
		stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
		if err != nil {
			o.Log.Warn("BPF run-time statistics unavailable", "err", err)
		} else {
			defer stats.Close()
			rep.BPFStats = true
		}
	}
	progBefore := progStats(dp, ref)

	for _, sc := range o.Scenarios {
		rep.Scenarios[sc] = scenarioText[sc]
	}
	cases := r.cases()
	rep.Cases = cases
	total, done := 0, 0
	for _, c := range cases {
		total += o.Reps * len(c.Paths())
	}
	for rep := range o.Reps {
		for _, c := range cases {
			for _, path := range c.PathsOfRep(rep) {
				s, err := r.measure(c, path)
				if err != nil {
					return nil, fmt.Errorf("%s%s %d B %s %s over %s: %w", c.Tool, c.Kind, c.Size, c.Scenario, c.Placement, path, err)
				}
				c.Samples[path] = append(c.Samples[path], s)
				done++
				progress(o.Progress, done, total, c, path)
			}
		}
	}
	if o.Progress != nil {
		fmt.Fprintln(o.Progress)
	}
	if _, err := dp.DetachAll(); err != nil {
		return nil, err
	}
	if rep.BPFStats {
		rep.Programs = progDelta(progBefore, progStats(dp, ref))
	}
	return rep, nil
}

// progStats are the run-time statistics of socklane's programs and the
// bare redirect's.
func progStats(dp *datapath.Datapath, ref *bare.Path) map[string]ProgStat {
	out := map[string]ProgStat{}
	for _, p := range append(dp.Programs(), ref.Programs()...) {
		info, err := p.Info()
		if err != nil {
			continue
		}
		st, err := p.Stats()
		if err != nil {
			continue
		}
		out[info.Name] = ProgStat{Name: info.Name, Runs: st.RunCount, NsRun: float64(st.Runtime.Nanoseconds())}
	}
	return out
}

func progDelta(before, after map[string]ProgStat) []ProgStat {
	var out []ProgStat
	for name, a := range after {
		b := before[name]
		runs := a.Runs - b.Runs
		if runs == 0 {
			continue
		}
		out = append(out, ProgStat{Name: name, Runs: runs, NsRun: (a.NsRun - b.NsRun) / float64(runs)})
	}
	slices.SortFunc(out, func(a, b ProgStat) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func kernel() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// congestion is the host's net.ipv4.tcp_congestion_control ("" if unread).
func congestion() string {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func cpus() int {
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) != nil {
		return 1
	}
	return set.Count()
}

// clientServer makes a bed with a client and a server pod, which the
// caller closes (closeBed); on error nothing is left.
func clientServer() (*testbed.Bed, *testbed.Pod, *testbed.Pod, error) {
	bed, err := testbed.New()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("creating pods: %w", err)
	}
	client, err := bed.AddPod("client")
	if err == nil {
		var server *testbed.Pod
		if server, err = bed.AddPod("server"); err == nil {
			return bed, client, server, nil
		}
	}
	_ = bed.Close()
	return nil, nil, nil, err
}

func closeBed(bed *testbed.Bed, log *slog.Logger) {
	if err := bed.Close(); err != nil {
		log.Warn("cleaning up pods", "err", err)
	}
}
