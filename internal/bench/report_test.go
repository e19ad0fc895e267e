package bench

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/socklane/socklane/internal/datapath"
)

// TestMarkdownNotes checks the report's notes that depend on what the run
// saw: bypass runs that moved to TCP, and run-time statistics left off.
func TestMarkdownNotes(t *testing.T) {
	// fallbacks: per run, directions moved by the backlog rule (ones) and
	// as small streams (tens).
	stream := func(fallbacks ...uint64) *Case {
		c := &Case{Kind: Throughput, Tool: Iperf3, Size: 16384, Placement: "same-cpu", Scenario: PodToPod, Samples: map[string][]Sample{}}
		for _, f := range fallbacks {
			c.Samples[PathTCP] = append(c.Samples[PathTCP], Sample{MBps: 1000})
			c.Samples[PathBypass] = append(c.Samples[PathBypass], Sample{MBps: 900, Redirected: 10, BacklogFallbacks: f % 10, StreamFallbacks: f / 10})
		}
		return c
	}
	// valve: two runs, the valve opened three times in the first and
	// passed a quarter of its bytes to TCP.
	valve := &Case{Kind: Throughput, Size: 1024, Placement: "same-cpu", Scenario: PodToPod, Samples: map[string][]Sample{
		PathTCP:    {{MBps: 300}, {MBps: 300}},
		PathBypass: {{MBps: 400, Redirected: 10, RedirectedBytes: 750, ValveOpens: 3, ValveBytes: 250}, {MBps: 400, Redirected: 10, RedirectedBytes: 1000}},
	}}
	for _, tc := range []struct {
		name     string
		rep      Report
		want     []string
		dontWant []string
	}{
		{
			name: "the valve in one run of two",
			rep:  Report{BPFStats: true, Congestion: "bbr", Cases: []*Case{valve}, Settings: datapath.Settings{BacklogValve: datapath.ModeOn}},
			want: []string{"### Bypass runs in which the valve pushed the writer back through TCP", "TCP's congestion control: bbr",
				"| One-way stream throughput | 1024 | pod-to-pod | same-cpu | 1 of 2 | 3 | 12.5% |"},
			dontWant: []string{"moved to TCP (receiver"},
		},
		{
			name:     "no fallback, statistics on",
			rep:      Report{BPFStats: true, Cases: []*Case{stream(0, 0, 0)}},
			want:     []string{"### iperf3 throughput, pod-to-pod, same-cpu"},
			dontWant: []string{"moved to TCP", "statistics were off", "the valve", "congestion control"},
		},
		{
			name: "fallback in two runs of three",
			rep:  Report{BPFStats: true, Cases: []*Case{stream(1, 0, 2)}},
			want: []string{"### Bypass runs that moved to TCP", "| iperf3 throughput | 16384 | pod-to-pod | same-cpu | 2 of 3 | 3 | 0 |", "left the bypass for good (the backlog rule"},
		},
		{
			name:     "small streams and backlog, the valve",
			rep:      Report{BPFStats: true, Cases: []*Case{stream(10, 21, 0, 0)}, Settings: datapath.Settings{BacklogValve: datapath.ModeOn}},
			want:     []string{"### Bypass runs that moved to TCP", "| iperf3 throughput | 16384 | pod-to-pod | same-cpu | 2 of 4 | 1 | 3 |", "pushed back through TCP while the readers caught up (the valve"},
			dontWant: []string{"left the bypass for good"},
		},
		{
			name:     "statistics off",
			rep:      Report{Cases: []*Case{stream(0)}},
			want:     []string{"statistics were off (--bpf-stats=false)"},
			dontWant: []string{"BPF program cost"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			tc.rep.Markdown(&b)
			for _, s := range tc.want {
				if !strings.Contains(b.String(), s) {
					t.Errorf("missing %q in:\n%s", s, b.String())
				}
			}
			for _, s := range tc.dontWant {
				if strings.Contains(b.String(), s) {
					t.Errorf("unexpected %q in:\n%s", s, b.String())
				}
			}
		})
	}
}

// TestPairRatio: bypass against the bare redirect is a ratio per
// interleaved repetition, reported as their median and spread.
func TestPairRatio(t *testing.T) {
	c := &Case{Kind: Latency, Size: 64, Placement: "cross-cpu", Scenario: PodToPod, Samples: map[string][]Sample{}}
	for i, b := range []float64{10, 30, 20} {
		c.Samples[PathTCP] = append(c.Samples[PathTCP], Sample{Mean: 40})
		c.Samples[PathBypass] = append(c.Samples[PathBypass], Sample{Mean: b})
		c.Samples[PathBare] = append(c.Samples[PathBare], Sample{Mean: []float64{10, 10, 20}[i]})
		c.Samples[PathUnix] = append(c.Samples[PathUnix], Sample{Mean: 5})
	}
	if got := c.pairRatio(PathBypass, PathBare, mean); got != "1.00 (1.00-3.00)" {
		t.Errorf("pair ratio %q, want the median 1.00 of 1, 3, 1 and their spread", got)
	}
	var b bytes.Buffer
	(&Report{Cases: []*Case{c}}).Markdown(&b)
	if want := "| 64 | 40.0 | 20.0 | 10.0 | 5.0 | 0.50 | 0.25 | 1.00 (1.00-3.00) | 4.00 |"; !strings.Contains(b.String(), want) {
		t.Errorf("missing %q in:\n%s", want, b.String())
	}
	delete(c.Samples, PathBare)
	if got := c.pairRatio(PathBypass, PathBare, mean); got != "-" {
		t.Errorf("without bare samples: %q, want -", got)
	}
}

// TestPathTaken: what the report says of a case's socklane samples under
// --default-settings, and which fallback counter names the reason.
func TestPathTaken(t *testing.T) {
	for _, tc := range []struct {
		kept []string // per sample: why it stayed on TCP, "" if bypassed
		want string
	}{
		{[]string{"", "", ""}, "bypass"},
		{[]string{"blocking", "blocking"}, "TCP (blocking)"},
		{[]string{"", "backlog", ""}, "bypass in 2 of 3, TCP (backlog) in 1 of 3"},
		{[]string{"brief", "blocking"}, "TCP (blocking) in 1 of 2, TCP (brief) in 1 of 2"},
	} {
		c := &Case{Samples: map[string][]Sample{}}
		for _, k := range tc.kept {
			c.Samples[PathBypass] = append(c.Samples[PathBypass], Sample{KeptOnTCP: k})
		}
		if got := c.pathTaken(); got != tc.want {
			t.Errorf("%q: %q, want %q", tc.kept, got, tc.want)
		}
	}
	for _, tc := range []struct {
		d    map[string]uint64
		want string
	}{
		{map[string]uint64{"conns_tcp": 9, "fallback_blocking": 2, "fallback_brief": 1}, "blocking"},
		{map[string]uint64{"fallback_blocking": 2, "fallback_brief": 2}, "blocking"},
		{map[string]uint64{"conns_tcp": 1}, "unknown"},
	} {
		if got := keptOnTCP(tc.d); got != tc.want {
			t.Errorf("keptOnTCP(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

// TestPathsOfRep: every repetition samples every path once, and each path
// holds each position equally often over two repetitions (A B B A).
func TestPathsOfRep(t *testing.T) {
	for _, c := range []*Case{{Kind: Throughput}, {Kind: Throughput, Tool: "qperf"}, {Kind: Services}, {Kind: Policies}} {
		paths := c.Paths()
		pos := map[string]int{}
		for rep := range 4 {
			got := c.PathsOfRep(rep)
			if len(got) != len(paths) {
				t.Fatalf("%s repetition %d: %v, want the %d paths %v", c.Kind, rep, got, len(paths), paths)
			}
			for i, p := range got {
				pos[p] += i
			}
		}
		for _, p := range paths {
			if want := 4 * (len(paths) - 1) / 2; pos[p] != want {
				t.Errorf("%s: path %s's positions over four repetitions sum to %d, want %d (each position as often)", c.Kind, p, pos[p], want)
			}
		}
	}
}

// TestControl: with --control a latency or throughput case measures the
// bare redirect twice, each ratio's path next to bare in both orders of
// a repetition, and the report sets the bare redirect's ratio to itself
// beside socklane's.
func TestControl(t *testing.T) {
	c := &Case{Kind: Latency, Size: 1024, Placement: "same-cpu", Scenario: PodToPod, Samples: map[string][]Sample{}, Control: true}
	for rep := range 2 {
		paths := c.PathsOfRep(rep)
		at := func(p string) int { return slices.Index(paths, p) }
		if d := at(PathBare) - at(PathBypass); d != 1 && d != -1 {
			t.Errorf("repetition %d: %v, bypass not next to bare", rep, paths)
		}
		if d := at(PathBare) - at(PathBareAgain); d != 1 && d != -1 {
			t.Errorf("repetition %d: %v, bare-again not next to bare", rep, paths)
		}
	}
	for i := range 3 {
		c.Samples[PathBypass] = append(c.Samples[PathBypass], Sample{Mean: []float64{11, 12, 9}[i], P50: 10})
		c.Samples[PathBare] = append(c.Samples[PathBare], Sample{Mean: 10, P50: 10})
		c.Samples[PathBareAgain] = append(c.Samples[PathBareAgain], Sample{Mean: []float64{10, 9, 13}[i], P50: 11})
	}
	var b bytes.Buffer
	(&Report{Cases: []*Case{c}, Control: true}).Markdown(&b)
	if want := "| latency | pod-to-pod | same-cpu | 1024 | 1.10 (0.90-1.20) | 1.00 (0.90-1.30) | 1.00 (1.00-1.00) | 1.10 (1.10-1.10) |"; !strings.Contains(b.String(), want) {
		t.Errorf("missing %q in:\n%s", want, b.String())
	}
	b.Reset()
	(&Report{Cases: []*Case{c}}).Markdown(&b)
	if strings.Contains(b.String(), "against itself") {
		t.Errorf("a report without --control has the control table:\n%s", b.String())
	}
	if got := (&Case{Kind: Latency}).Paths(); slices.Contains(got, PathBareAgain) {
		t.Errorf("paths without --control: %v", got)
	}
}
