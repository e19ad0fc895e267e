package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/bench"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/peer"
	"github.com/socklane/socklane/internal/testutil"
)

// readReport reads a JSON report bench wrote.
func readReport(t *testing.T, path string) bench.Report {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep bench.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("parsing the JSON report: %v", err)
	}
	return rep
}

// TestBench runs `socklane bench` at a tiny size: every measurement and
// placement runs, the JSON parses, and the datapath's counters show that
// the bypass runs were redirected and the others were not. No speed is
// asserted.
func TestBench(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Binary(t)
	dir := t.TempDir()
	jsonPath, svgPath := filepath.Join(dir, "bench.json"), filepath.Join(dir, "bench.svg")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tools := []string{bench.Qperf, bench.Sockperf, bench.Iperf3}
	for _, tool := range tools {
		testutil.RequireCommand(t, tool)
	}
	cmd := exec.CommandContext(ctx, bin, "bench", "--reps", "2", "--sizes", "1,4096", "--count", "200",
		"--duration", "50ms", "--echo-count", "200", "--connects", "20", "--json", jsonPath, "--svg", svgPath,
		"--tools", strings.Join(tools, ","), "--tool-sizes", "64", "--tool-duration", "1s", "--service-counts", "10,300", "--iptables-max-services", "100", "--policy-counts", "20,300")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("socklane bench: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "| bypass / TCP |") || !strings.Contains(string(out), "| bypass / TCP p50 |") || !strings.Contains(string(out), "iptables-restore ms") ||
		!strings.Contains(string(out), "| 300 | not run |") || !strings.Contains(string(out), "ceiling: iptables / direct") ||
		!strings.Contains(string(out), "connect cost policies / none") {
		t.Errorf("no Markdown table in the output:\n%s", out)
	}
	rep := readReport(t, jsonPath)
	// socklane's client: 2 sizes x (latency + throughput) + echo + connect,
	// in 3 scenarios, on 2 placements. Tools, pod to pod at one size on 2
	// placements: qperf and sockperf latency + throughput, iperf3 throughput.
	// Services and policies: 2 counts each on 2 placements.
	if want := (2*2+2)*3*2 + (2+2+1)*2 + 2*2 + 2*2; len(rep.Cases) != want {
		t.Fatalf("%d cases, want %d", len(rep.Cases), want)
	}
	seen := map[string]bool{}
	for _, c := range rep.Cases {
		seen[c.Scenario], seen[c.Kind] = true, true
		if c.Tool != "" {
			seen[c.Tool] = true
		}
		if c.Kind == bench.Services && c.NoBaseline != (c.Size > 100) {
			t.Errorf("services %d %s: baseline skipped %v, want it skipped above --iptables-max-services 100", c.Size, c.Placement, c.NoBaseline)
		}
		if c.NoBaseline && len(c.Samples[bench.PathIptables]) > 0 {
			t.Errorf("services %d %s: iptables ran above --iptables-max-services", c.Size, c.Placement)
		}
		for _, path := range c.Paths() {
			ss := c.Samples[path]
			if len(ss) != 2 {
				t.Errorf("%s%s %d %s %s %s: %d samples, want 2", c.Tool, c.Kind, c.Size, c.Scenario, c.Placement, path, len(ss))
			}
			for _, s := range ss {
				if (path == bench.PathBypass || path == bench.PathBare) != (s.Redirected > 0) {
					t.Errorf("%s%s %d %s %s %s: %d messages redirected", c.Tool, c.Kind, c.Size, c.Scenario, c.Placement, path, s.Redirected)
				}
				if c.Kind == bench.Policies && ((s.ProgramMs > 0) != (path == bench.PathPolicies) || s.MBps == 0 || s.Mean == 0) {
					t.Errorf("policies %d %s %s: programming time %.3f ms, stream %.0f MB/s, connect %.1f us", c.Size, c.Placement, path, s.ProgramMs, s.MBps, s.Mean)
				}
				if c.Kind == bench.Services && (s.ProgramMs > 0) != (path != bench.PathDirect) {
					t.Errorf("services %d %s %s: programming time %.3f ms", c.Size, c.Placement, path, s.ProgramMs)
				}
				if s.Mean == 0 && s.MBps == 0 {
					t.Errorf("%s%s %d %s %s %s: empty sample", c.Tool, c.Kind, c.Size, c.Scenario, c.Placement, path)
				}
			}
		}
	}
	for _, want := range append(append(bench.Scenarios(), tools...), bench.Services, bench.Policies) {
		if !seen[want] {
			t.Errorf("nothing ran for %s", want)
		}
	}
	if !rep.BPFStats || len(rep.Programs) == 0 {
		t.Errorf("BPF run-time statistics on %v, %d programs in the report; want them on by default", rep.BPFStats, len(rep.Programs))
	}
	if rep.IO != peer.IOBlocking {
		t.Errorf("report says socket I/O %q, want the default %q", rep.IO, peer.IOBlocking)
	}
	svg, err := os.ReadFile(svgPath)
	if err != nil || !strings.HasPrefix(string(svg), "<svg") {
		t.Errorf("SVG chart missing or malformed: %v", err)
	}
}

// TestBenchNetpoll runs socklane's peers through Go's netpoller (the
// event-driven way), with every connection joining the bypass and the BPF
// run-time statistics off, and checks that a bad --io is refused before
// anything is set up.
func TestBenchNetpoll(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Binary(t)
	jsonPath := filepath.Join(t.TempDir(), "bench.json")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "bench", "--io", "netpoll", "--bypass-brief", "--bpf-stats=false", "--measure", "latency,connect", "--scenarios", "pod-to-pod",
		"--sizes", "64", "--reps", "1", "--count", "100", "--connects", "20", "--tools", "", "--json", jsonPath).CombinedOutput()
	if err != nil {
		t.Fatalf("socklane bench --io netpoll: %v\n%s", err, out)
	}
	rep := readReport(t, jsonPath)
	if rep.IO != peer.IONetpoll || !rep.BypassBrief || len(rep.Cases) != 4 {
		t.Fatalf("report: I/O %q, bypass brief %v, %d cases; want netpoll, true, 4", rep.IO, rep.BypassBrief, len(rep.Cases))
	}
	if rep.BPFStats || len(rep.Programs) > 0 || !strings.Contains(string(out), "statistics were off (--bpf-stats=false)") {
		t.Errorf("--bpf-stats=false: report says statistics on %v with %d programs\n%s", rep.BPFStats, len(rep.Programs), out)
	}
	for _, c := range rep.Cases {
		if s := c.Samples[bench.PathBypass]; len(s) != 1 || s[0].Redirected == 0 {
			t.Errorf("%s %s: bypass samples %+v, want one that was redirected", c.Kind, c.Placement, s)
		}
	}

	out, err = exec.CommandContext(ctx, bin, "bench", "--io", "epoll").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `--io "epoll": want blocking or netpoll`) {
		t.Errorf("bench --io epoll: %v\n%s", err, out)
	}
}

// TestBenchPrograms runs the programs (redis-server with redis-benchmark
// and with redis-cli, python3's http.server with urllib, Java's blocking sockets, nginx with
// curl, Go's net/http on both ends, postgres with pgbench) small, with the
// agent's default settings, and checks on the kernel's counters which path
// each took: the event-driven ones, redis-cli and python (blocking, no
// signal that can interrupt a read) bypassed, Java (blocking; the JVM handles signals
// that can) kept on TCP where the kernel has the interrupted-read bug, and
// the report's last column says so. No speed is asserted.
func TestBenchPrograms(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Binary(t)
	for _, cmd := range []string{"redis-server", "redis-benchmark", "redis-cli", "python3", "java", "javac", "nginx", "curl", "setpriv"} {
		testutil.RequireCommand(t, cmd)
	}
	if _, err := os.Stat("/usr/lib/postgresql"); err != nil {
		testutil.RequireCommand(t, "postgres")
	}
	tools := []string{bench.Redis, bench.RedisCLI, bench.Python, bench.Java, bench.Nginx, bench.GoHTTP, bench.Postgres}
	if !slices.Equal(tools, bench.Programs()) {
		t.Fatalf("bench lists programs %v; this test runs %v", bench.Programs(), tools)
	}
	jsonPath := filepath.Join(t.TempDir(), "bench.json")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "bench", "--default-settings", "--measure", "latency", "--scenarios", "pod-to-pod", "--sizes", "64",
		"--reps", "1", "--count", "300", "--tools", strings.Join(tools, ","), "--tool-sizes", "1024", "--tool-duration", "1s", "--json", jsonPath).CombinedOutput()
	if err != nil {
		t.Fatalf("socklane bench --tools %s: %v\n%s", strings.Join(tools, ","), err, out)
	}
	rep := readReport(t, jsonPath)
	if !rep.DefaultSettings || !strings.Contains(string(out), "socklane's path") {
		t.Errorf("report: default settings %v; want true and the path column\n%s", rep.DefaultSettings, out)
	}
	// Per process where the kernel has the interrupted-read bug.
	perProcess := rep.Settings.BypassBlocking == datapath.ModeProcess
	seen := map[string]int{}
	for _, c := range rep.Cases {
		if c.Tool == "" {
			continue
		}
		seen[c.Tool]++
		want := ""
		if c.Tool == bench.Java && perProcess {
			want = "blocking"
		}
		for _, path := range []string{bench.PathTCP, bench.PathBypass, bench.PathBare} {
			if len(c.Samples[path]) != 1 {
				t.Errorf("%s %s %s: %d samples on %s, want 1", c.Tool, c.Kind, c.Placement, len(c.Samples[path]), path)
			}
		}
		for _, s := range c.Samples[bench.PathBypass] {
			if s.KeptOnTCP != want || (want == "") != (s.Redirected > 0) {
				t.Errorf("%s %s %s: kept on TCP for %q with %d messages redirected; want %q", c.Tool, c.Kind, c.Placement, s.KeptOnTCP, s.Redirected, want)
			}
		}
	}
	// One case a placement each (python measures throughput, the others
	// latency; postgres one size of its own).
	for _, tool := range tools {
		if seen[tool] != 2 {
			t.Errorf("%d cases of %s, want 2 (one a placement)\n%s", seen[tool], tool, out)
		}
	}
	t.Logf("%s", out)
}

// TestBenchScrape runs `socklane bench scrape` small: services programmed,
// connections held open and bypassed (the map holds both ends of each),
// and a scrape whose series include every service. No speed is asserted.
func TestBenchScrape(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "-o", "json", "bench", "scrape", "--services", "300", "--conns", "8000", "--reps", "2").Output()
	if err != nil {
		t.Fatalf("socklane bench scrape: %v\n%s", err, out)
	}
	var rep bench.ScrapeReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("parsing %q: %v", out, err)
	}
	t.Logf("%+v", rep)
	// 8,000 connections over two sink ports: both ends of each in the map.
	if rep.BypassedSockets != 16000 || len(rep.ScrapeMs) != 2 || len(rep.TableCountMs) != 2 {
		t.Errorf("report %+v: want 16000 bypassed sockets and 2 samples of each", rep)
	}
	// One selection and one refusal series per service at least.
	if rep.Series < 300 {
		t.Errorf("%d series in a scrape of 300 services", rep.Series)
	}
}

// TestBenchSync runs `socklane bench --measure sync` small: two agents
// replicate every burst, every steady update is read back from the
// peer's map, the initial sync brings every entry, and the writing
// program's run time is measured with and without change records.
func TestBenchSync(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Binary(t)
	jsonPath := filepath.Join(t.TempDir(), "sync.json")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "bench", "--measure", "sync", "--reps", "1", "--sync-updates", "20000",
		"--sync-rate", "2000", "--sync-rate-duration", "1s", "--sync-initial", "20000", "--sync-sessions", "5000",
		"--sync-capture-writes", "8192", "--json", jsonPath).CombinedOutput()
	if err != nil {
		t.Fatalf("socklane bench --measure sync: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "replicated updates per second") {
		t.Errorf("no Markdown table in the output:\n%s", out)
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep bench.SyncReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	one := func(name string, v []float64) float64 {
		if len(v) != 1 || v[0] <= 0 {
			t.Errorf("%s = %v, want one positive value", name, v)
			return 0
		}
		return v[0]
	}
	one("replicated", rep.Replicated)
	one("writer rate", rep.WriterRate)
	one("p99", rep.P99ms)
	one("initial sync", rep.InitialS)
	one("sessions", rep.SessionMs)
	one("ns plain", rep.NsPlain)
	one("ns capture", rep.NsCapture)
	if got := one("observed", rep.Observed); got != 1 {
		t.Errorf("%.3f of the steady updates were read back from the peer, want all (2,000 a second over 5,000 keys are never overwritten within a second)", got)
	}
}

// TestBenchPorts runs `socklane bench --measure ports` small: binds and
// connects with N port workloads and with none, on every placement; the
// bench itself fails a run whose port counters do not show the rules at
// work (or show them without rules).
func TestBenchPorts(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Binary(t)
	jsonPath := filepath.Join(t.TempDir(), "ports.json")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "bench", "--measure", "ports", "--reps", "2", "--connects", "50",
		"--port-rule-counts", "5,300", "--tools", "", "--json", jsonPath).CombinedOutput()
	if err != nil {
		t.Fatalf("socklane bench --measure ports: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "| bind bystander us |") {
		t.Errorf("no Markdown table in the output:\n%s", out)
	}
	rep := readReport(t, jsonPath)
	if len(rep.Cases) != 2*2 {
		t.Fatalf("%d cases, want 2 rule counts on 2 placements", len(rep.Cases))
	}
	for _, c := range rep.Cases {
		for _, path := range c.Paths() {
			ss := c.Samples[path]
			if len(ss) != 2 {
				t.Errorf("ports %d %s %s: %d samples, want 2", c.Size, c.Placement, path, len(ss))
			}
			if len(c.Paths()) != 3 {
				t.Errorf("ports %d: paths %v, want none, bystander and workload", c.Size, c.Paths())
			}
			for _, s := range ss {
				if s.BindUs <= 0 || s.Mean <= 0 || (s.ProgramMs > 0) != (path != bench.PathNoPortRules) {
					t.Errorf("ports %d %s %s: bind %.2f us, connect %.1f us, programming %.2f ms", c.Size, c.Placement, path, s.BindUs, s.Mean, s.ProgramMs)
				}
			}
		}
	}
}
