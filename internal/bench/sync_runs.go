package bench

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/statesync"
)

// Key ranges of the sync measurement's runs in the churn map.
const (
	syncSessionsBase = 1 << 20
	syncSteadyBase   = 1<<20 + 1<<18
	syncSteadyKeys   = 5000
	syncCaptureBase  = 1<<20 + 1<<19
)

// applied is how many peer changes node n applied so far.
func (b *syncBench) applied(n *syncBenchNode) (uint64, error) {
	st, err := b.status(n)
	return st.Counters.Applied, err
}

// burst writes count distinct keys from base on node A as fast as the
// writer goes and waits until node B applied them all. It returns the
// replicated and the written updates per second.
func (b *syncBench) burst(rep, base uint64, count int) (float64, float64, error) {
	a, bn := b.nodes[0], b.nodes[1]
	before, err := b.applied(bn)
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	for i := 0; i < count; i += statesync.ChurnBatch {
		v := statesync.ChurnVal{Seq: rep<<40 | uint64(i)}
		if err := a.churn.WriteRange(base+uint64(i), min(statesync.ChurnBatch, count-i), v, false, true); err != nil {
			return 0, 0, err
		}
	}
	wrote := time.Since(start)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		n, err := b.applied(bn)
		if err != nil {
			return 0, 0, err
		}
		if n >= before+uint64(count) {
			break
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("node-b applied %d of %d updates in 2 minutes", n-before, count)
		}
		time.Sleep(2 * time.Millisecond)
	}
	b.lastBurst = time.Since(start)
	return float64(count) / b.lastBurst.Seconds(), float64(count) / wrote.Seconds(), nil
}

// steady writes Rate updates a second for RateDuration on A, over
// syncSteadyKeys keys, and reads each written key back from B's map
// every millisecond: the latency of an update is from its write to the
// first read that finds it. An update overwritten before it was found is
// not observed.
func (b *syncBench) steady(rep uint64) ([]float64, float64, error) {
	a, bn := b.nodes[0], b.nodes[1]
	type write struct {
		key, seq uint64
		at       time.Time
	}
	var mu sync.Mutex
	var pending []write
	total := int(float64(b.o.Rate) * b.o.RateDuration.Seconds())
	done := make(chan error, 1)
	go func() {
		start := time.Now()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for i := 0; i < total; {
			<-tick.C
			due := min(total, int(time.Since(start).Seconds()*float64(b.o.Rate)))
			for ; i < due; i++ {
				key := syncSteadyBase + uint64(i%syncSteadyKeys)
				seq := rep<<40 | 1<<39 | uint64(i)
				at := time.Now()
				if err := a.churn.Write(key, statesync.ChurnVal{Seq: seq}, false, true); err != nil {
					done <- err
					return
				}
				mu.Lock()
				pending = append(pending, write{key, seq, at})
				mu.Unlock()
			}
		}
		done <- nil
	}()
	var lat []float64
	seen := 0
	var writerErr error
	writing := true
	deadline := time.Time{}
	m := bn.churn.Map()
	for {
		if writing {
			select {
			case writerErr = <-done:
				writing = false
				deadline = time.Now().Add(5 * time.Second)
			default:
			}
		}
		mu.Lock()
		batch := slices.Clone(pending[:min(len(pending), 512)])
		mu.Unlock()
		popped := 0
		for _, w := range batch {
			var v statesync.ChurnVal
			if err := m.Lookup(w.key, &v); err != nil && !isMissing(err) {
				return nil, 0, err
			}
			if v.Seq < w.seq {
				break
			}
			seen++
			if v.Seq == w.seq {
				lat = append(lat, float64(time.Since(w.at).Microseconds())/1000)
			}
			popped++
		}
		mu.Lock()
		pending = pending[popped:]
		left := len(pending)
		mu.Unlock()
		if !writing && (left == 0 || time.Now().After(deadline)) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if writerErr != nil {
		return nil, 0, writerErr
	}
	if seen < total {
		return nil, 0, fmt.Errorf("node-b never got %d of %d steady updates", total-seen, total)
	}
	return lat, float64(len(lat)) / float64(total), nil
}

func isMissing(err error) bool {
	return err != nil && strings.Contains(err.Error(), "key does not exist")
}

// captureCost runs the writing program (256 writes a run) with and
// without change records in 8 rounds, the order of the two swapped every
// round (ABBA) so that a drift of the machine's speed falls on both, and
// returns the medians of the rounds' run time per write, from the
// kernel's statistics.
func (b *syncBench) captureCost(rep uint64) (float64, float64, error) {
	a := b.nodes[0]
	prog := a.churn.Program()
	const rounds = 8
	var perWrite [2][]float64
	per := max(b.o.CaptureWrites/rounds, statesync.ChurnBatch)
	for round := range rounds {
		for i := range 2 {
			mode := i ^ round%2
			before, err := prog.Stats()
			if err != nil {
				return 0, 0, fmt.Errorf("reading the program's statistics: %w", err)
			}
			for i := 0; i < per; i += statesync.ChurnBatch {
				v := statesync.ChurnVal{Seq: rep<<40 | uint64(round*per+i)}
				if err := a.churn.WriteRange(syncCaptureBase+uint64(i), min(statesync.ChurnBatch, per-i), v, false, mode == 1); err != nil {
					return 0, 0, err
				}
			}
			after, err := prog.Stats()
			if err != nil {
				return 0, 0, err
			}
			perWrite[mode] = append(perWrite[mode], float64((after.Runtime-before.Runtime).Nanoseconds())/float64(per))
		}
	}
	return median(perWrite[0]), median(perWrite[1]), nil
}

// initial empties both maps, fills A's with Initial entries from user
// space, restarts A's agent (it publishes them), then starts B's and
// times it from its start to all entries applied.
func (b *syncBench) initial(rep uint64) (float64, error) {
	a, bn := b.nodes[0], b.nodes[1]
	for _, n := range b.nodes {
		b.stop(n)
		dir := n.churn.Dir
		n.churn.Close()
		if err := n.churn.Unpin(); err != nil {
			return 0, err
		}
		ch, err := statesync.OpenChurn(dir, 0)
		if err != nil {
			return 0, err
		}
		n.churn = ch
	}
	keys := make([]uint64, b.o.Initial)
	vals := make([]statesync.ChurnVal, b.o.Initial)
	for i := range keys {
		keys[i] = uint64(i)
		vals[i] = statesync.ChurnVal{Seq: rep<<40 | 1<<38 | uint64(i)}
	}
	for i := 0; i < len(keys); i += 65536 {
		j := min(i+65536, len(keys))
		if _, err := a.churn.Map().BatchUpdate(keys[i:j], vals[i:j], &ebpf.BatchOptions{}); err != nil {
			return 0, fmt.Errorf("filling node-a's map: %w", err)
		}
	}
	if err := b.start(a); err != nil {
		return 0, err
	}
	if err := b.waitEntries(a, b.o.Initial, false); err != nil {
		return 0, err
	}
	start := time.Now()
	if err := b.start(bn); err != nil {
		return 0, err
	}
	if err := b.waitEntries(bn, b.o.Initial, true); err != nil {
		return 0, err
	}
	took := time.Since(start).Seconds()
	return took, b.waitBootstrapped()
}

// waitEntries waits until n's synced table holds want entries (and,
// with booted, n has its peer's state).
func (b *syncBench) waitEntries(n *syncBenchNode, want int, booted bool) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := b.status(n)
		if err == nil && len(st.Tables) > 0 && st.Tables[0].Entries >= want && (!booted || st.Bootstrapped) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s holds %+v, not %d entries, after 2 minutes (%v)", n.name, st.Tables, want, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// procCPU is a process's user and system CPU seconds so far.
func procCPU(cmd *exec.Cmd) float64 {
	if cmd == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields after the command name (which may hold spaces).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// peakRSS is a process's peak resident memory in MiB.
func peakRSS(cmd *exec.Cmd) float64 {
	if cmd == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

func percentile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(q * float64(len(s)-1))
	return s[i]
}

// Markdown writes the sync measurement's table.
func (r *SyncReport) Markdown(w io.Writer) {
	fmt.Fprintf(w, "### State sync (two nodes, %d repetitions, medians; kernel %s, %d CPUs)\n\n", r.Reps, r.Kernel, r.CPUs)
	fmt.Fprintln(w, "| measure | median | range | target |")
	fmt.Fprintln(w, "|---|---|---|---|")
	row := func(what string, v []float64, format, target string) {
		lo, hi := slices.Min(v), slices.Max(v)
		fmt.Fprintf(w, "| %s | "+format+" | "+format+" - "+format+" | %s |\n", what, median(v), lo, hi, target)
	}
	row(fmt.Sprintf("replicated updates per second (%d distinct keys, as fast as written)", r.Updates), r.Replicated, "%.0f", ">= 200,000")
	row("the writer's own rate (updates per second)", r.WriterRate, "%.0f", "")
	row(fmt.Sprintf("convergence p50 at %d updates/s (ms)", r.Rate), r.P50ms, "%.2f", "")
	row(fmt.Sprintf("convergence p99 at %d updates/s (ms)", r.Rate), r.P99ms, "%.2f", "< 100")
	row(fmt.Sprintf("convergence max at %d updates/s (ms)", r.Rate), r.Maxms, "%.2f", "")
	row("updates observed before being overwritten (fraction)", r.Observed, "%.3f", "")
	row(fmt.Sprintf("initial sync of %d entries, agent start to all applied (s)", r.Initial), r.InitialS, "%.2f", "< 5")
	row(fmt.Sprintf("the seed's demo: %d sessions written and replicated (ms)", r.Sessions), r.SessionMs, "%.0f", "")
	row("writing program, ns per write without change records", r.NsPlain, "%.0f", "")
	row("writing program, ns per write with change records", r.NsCapture, "%.0f", "")
	capt := make([]float64, len(r.NsPlain))
	for i := range capt {
		capt[i] = r.NsCapture[i]/r.NsPlain[i] - 1
	}
	row("cost of change capture (fraction of the writing program's run time)", capt, "%.3f", "<= 0.02")
	row("sending agent CPU seconds per million updates", r.CPUSenderS, "%.2f", "")
	row("receiving agent CPU seconds per million updates", r.CPUReceiverS, "%.2f", "")
	fmt.Fprintf(w, "\nPeak resident memory: sender %.0f MiB, receiver %.0f MiB.\n", r.RSSSenderMB, r.RSSReceivMB)
}
