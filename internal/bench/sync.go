package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/agent"
	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/statesync"
	"github.com/socklane/socklane/internal/testbed"
	"golang.org/x/sys/unix"
)

// Sync measures the state sync between two nodes on this machine: two
// agents in their own network namespaces over the node bridge, each
// with its own datapath, syncing the map a BPF program writes (with
// change records, sl_sync.h).
const Sync = "sync"

// SyncOptions of the sync measurement.
type SyncOptions struct {
	BPFFS string
	Reps  int
	// Updates per throughput run (distinct keys, written as fast as the
	// writer goes).
	Updates int
	// Rate and RateDuration: the steady write rate of the latency runs.
	Rate         int
	RateDuration time.Duration
	// Initial entries node B gets by snapshot when it starts empty.
	Initial int
	// Sessions: the seed's demo (entries written as fast as the writer
	// goes, all replicated).
	Sessions int
	// CaptureWrites per run of the capture-cost measurement.
	CaptureWrites int
	Progress      io.Writer
	Log           *slog.Logger
}

// SyncReport is the sync measurement's result; every slice has one value
// per repetition.
type SyncReport struct {
	Started time.Time `json:"started"`
	Kernel  string    `json:"kernel"`
	CPUs    int       `json:"cpus"`
	Reps    int       `json:"reps"`
	// Throughput: updates replicated per second (first write on A to the
	// last applied on B), and how fast the writer wrote them.
	Updates    int       `json:"updates"`
	Replicated []float64 `json:"replicated_per_s"`
	WriterRate []float64 `json:"writer_per_s"`
	// Latency at a steady rate: write on A to the value read back from
	// B's map (polled every millisecond), milliseconds.
	Rate      int       `json:"rate_per_s"`
	P50ms     []float64 `json:"p50_ms"`
	P99ms     []float64 `json:"p99_ms"`
	Maxms     []float64 `json:"max_ms"`
	Observed  []float64 `json:"observed_fraction"`
	Initial   int       `json:"initial_entries"`
	InitialS  []float64 `json:"initial_sync_s"`
	Sessions  int       `json:"sessions"`
	SessionMs []float64 `json:"sessions_ms"`
	// The writing program's run time per write without and with change
	// records (kernel statistics).
	NsPlain   []float64 `json:"ns_per_write_plain"`
	NsCapture []float64 `json:"ns_per_write_capture"`
	// Agents' CPU time per million updates sent (A) and applied (B), and
	// their peak resident memory.
	CPUSenderS   []float64 `json:"sender_cpu_s_per_million"`
	CPUReceiverS []float64 `json:"receiver_cpu_s_per_million"`
	RSSSenderMB  float64   `json:"sender_peak_rss_mb"`
	RSSReceivMB  float64   `json:"receiver_peak_rss_mb"`
}

type syncBenchNode struct {
	name  string
	pod   *testbed.Pod
	inst  string
	churn *statesync.Churn
	addr  string
	cmd   *exec.Cmd
	logs  *strings.Builder
}

type syncBench struct {
	o     SyncOptions
	self  string
	certs string
	nodes [2]*syncBenchNode
	ctx   context.Context
	// lastBurst is the last burst's time, first write to last applied.
	lastBurst time.Duration
}

// RunSync runs the sync measurement.
func RunSync(ctx context.Context, o SyncOptions) (*SyncReport, error) {
	if _, err := node.Preflight(o.BPFFS, nil); err != nil {
		return nil, err
	}
	if o.Reps < 1 || o.Updates < 1000 || o.Rate < 100 || o.Initial < 1000 || o.Sessions < 1 || o.CaptureWrites < 1000 {
		return nil, errors.New("bench sync: need at least one repetition, 1,000 updates, initial entries and capture writes, and a rate of 100/s")
	}
	if max(o.Updates, o.Initial) > 1<<20 {
		return nil, fmt.Errorf("bench sync: at most %d updates and initial entries (the synced map and the resend log hold that many)", 1<<20)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	bed, err := testbed.New()
	if err != nil {
		return nil, fmt.Errorf("creating pods: %w", err)
	}
	defer closeBed(bed, o.Log)
	b := &syncBench{o: o, self: self, ctx: ctx}
	if b.certs, err = os.MkdirTemp("", "socklane-bench-sync-"); err != nil {
		return nil, err
	}
	defer os.RemoveAll(b.certs)
	pins := filepath.Join(o.BPFFS, "socklane-bench-sync-"+strconv.Itoa(os.Getpid()))
	defer os.RemoveAll(pins)
	names := []string{"node-a", "node-b"}
	if err := statesync.MakeCerts(b.certs, names, time.Hour); err != nil {
		return nil, err
	}
	for i, name := range names {
		pod, err := bed.AddPod(name)
		if err != nil {
			return nil, err
		}
		ch, err := statesync.OpenChurn(filepath.Join(pins, name), 0)
		if err != nil {
			return nil, err
		}
		n := &syncBenchNode{name: name, pod: pod, churn: ch, inst: fmt.Sprintf("socklane-bench-sync-%d-%s", os.Getpid(), name), addr: pod.IPv4.String() + ":7400"}
		b.nodes[i] = n
		defer func() {
			b.stop(n)
			_ = ch.Unpin()
			ch.Close()
			if _, err := node.Down(filepath.Join(o.BPFFS, n.inst), true, 0, o.Log); err != nil {
				o.Log.Warn("removing a bench datapath", "instance", n.inst, "err", err)
			}
		}()
	}
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("turning on BPF run-time statistics (the capture cost needs them): %w", err)
	}
	defer stats.Close()
	for _, n := range b.nodes {
		if err := b.start(n); err != nil {
			return nil, err
		}
	}
	if err := b.waitBootstrapped(); err != nil {
		return nil, err
	}
	rep := &SyncReport{Started: time.Now().UTC(), Kernel: kernel(), CPUs: cpus(), Reps: o.Reps, Updates: o.Updates, Rate: o.Rate, Initial: o.Initial, Sessions: o.Sessions}
	a, bn := b.nodes[0], b.nodes[1]
	for rep1 := range o.Reps {
		b.progress("throughput", rep1)
		cpuA, cpuB := procCPU(a.cmd), procCPU(bn.cmd)
		repl, writer, err := b.burst(uint64(rep1), 0, o.Updates)
		if err != nil {
			return nil, err
		}
		rep.Replicated, rep.WriterRate = append(rep.Replicated, repl), append(rep.WriterRate, writer)
		m := float64(o.Updates) / 1e6
		rep.CPUSenderS = append(rep.CPUSenderS, (procCPU(a.cmd)-cpuA)/m)
		rep.CPUReceiverS = append(rep.CPUReceiverS, (procCPU(bn.cmd)-cpuB)/m)

		b.progress("sessions", rep1)
		_, _, err = b.burst(uint64(rep1), 1<<20, o.Sessions)
		if err != nil {
			return nil, err
		}
		// The burst's time is from the first write to the last applied.
		rep.SessionMs = append(rep.SessionMs, b.lastBurst.Seconds()*1000)

		b.progress("latency", rep1)
		lat, observed, err := b.steady(uint64(rep1))
		if err != nil {
			return nil, err
		}
		rep.P50ms = append(rep.P50ms, percentile(lat, 0.50))
		rep.P99ms = append(rep.P99ms, percentile(lat, 0.99))
		rep.Maxms = append(rep.Maxms, percentile(lat, 1))
		rep.Observed = append(rep.Observed, observed)

		b.progress("capture cost", rep1)
		plain, capt, err := b.captureCost(uint64(rep1))
		if err != nil {
			return nil, err
		}
		rep.NsPlain, rep.NsCapture = append(rep.NsPlain, plain), append(rep.NsCapture, capt)

		b.progress("initial sync", rep1)
		secs, err := b.initial(uint64(rep1))
		if err != nil {
			return nil, err
		}
		rep.InitialS = append(rep.InitialS, secs)
	}
	rep.RSSSenderMB, rep.RSSReceivMB = peakRSS(a.cmd), peakRSS(bn.cmd)
	if o.Progress != nil {
		fmt.Fprintln(o.Progress)
	}
	return rep, nil
}

func (b *syncBench) progress(what string, rep int) {
	if b.o.Progress != nil {
		fmt.Fprintf(b.o.Progress, "\rsync: repetition %d/%d: %-14s", rep+1, b.o.Reps, what)
	}
}

func (b *syncBench) args(n *syncBenchNode) []string {
	other := b.nodes[0]
	if other == n {
		other = b.nodes[1]
	}
	return []string{"--bpffs", b.o.BPFFS, "--name", n.inst, "agent", "--cgroup", n.pod.Cgroup, "--metrics-address", "",
		"--node-name", n.name, "--sync-listen", n.addr, "--sync-peer", other.name + "=" + other.addr,
		"--sync-map", filepath.Join(n.churn.Dir, statesync.ChurnMapName()) + ",name=sessions,changes=" + n.churn.Dir,
		"--sync-ca", filepath.Join(b.certs, "ca.pem"), "--sync-cert", filepath.Join(b.certs, n.name+".pem"),
		"--sync-key", filepath.Join(b.certs, n.name+"-key.pem"), "--sync-bootstrap-timeout", "1s"}
}

func (b *syncBench) start(n *syncBenchNode) error {
	cmd, err := n.pod.Command(b.self, b.args(n)...)
	if err != nil {
		return err
	}
	n.logs = &strings.Builder{}
	cmd.Stdout, cmd.Stderr = n.logs, n.logs
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the agent of %s: %w", n.name, err)
	}
	n.cmd = cmd
	return nil
}

func (b *syncBench) stop(n *syncBenchNode) {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Kill()
	_ = n.cmd.Wait()
	n.cmd = nil
}

func (b *syncBench) status(n *syncBenchNode) (statesync.Status, error) {
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	return agent.ReadSyncStatus(ctx, n.inst)
}

func (b *syncBench) waitBootstrapped() error {
	for _, n := range b.nodes {
		deadline := time.Now().Add(30 * time.Second)
		for {
			st, err := b.status(n)
			// Bootstrapped, and the first read of its own map done: the
			// next run does not share the machine with a start.
			if err == nil && st.Bootstrapped && st.Counters.Polls > 0 {
				break
			}
			if time.Now().After(deadline) || b.ctx.Err() != nil {
				return fmt.Errorf("the agent of %s did not start (%v): %s", n.name, err, n.logs.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}
