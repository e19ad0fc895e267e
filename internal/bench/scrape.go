package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/metrics"
	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/testbed"
)

// ScrapeOptions sizes the scrape measurement: a node with Services
// services and Conns bypassed connections (two sockets each) between two
// pods.
type ScrapeOptions struct {
	BPFFS    string
	Services int
	Conns    int
	Reps     int
	Log      *slog.Logger
}

// ScrapeReport is what a /metrics scrape costs on such a node, against
// counting the node's tables (what every scrape used to do, and what the
// agent now does in the background at most every 10 s).
type ScrapeReport struct {
	Kernel          string    `json:"kernel"`
	Services        int       `json:"services"`
	Conns           int       `json:"conns"`
	BypassedSockets int       `json:"bypassed_sockets"`
	Series          int       `json:"series"`
	ScrapeMs        []float64 `json:"scrape_ms"`
	TableCountMs    []float64 `json:"table_count_ms"`
	ScrapeMedianMs  float64   `json:"scrape_median_ms"`
	CountMedianMs   float64   `json:"table_count_median_ms"`
}

// connsPerPort keeps each sink under the default open-file limit and the
// client within one port range per destination port.
const connsPerPort = 7500

// Scrape measures a scrape of the agent's collector (the full Prometheus
// gather, in process) o.Reps times, interleaved with a count of the
// tables.
func Scrape(ctx context.Context, o ScrapeOptions) (*ScrapeReport, error) {
	if _, err := node.Preflight(o.BPFFS, nil); err != nil {
		return nil, err
	}
	if o.Services < 0 || o.Services > MaxServices || o.Conns < 1 || o.Reps < 1 {
		return nil, fmt.Errorf("bench scrape: want 0 to %d services, at least one connection and one repetition", MaxServices)
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
	pinDir := filepath.Join(o.BPFFS, "socklane-bench-scrape-"+strconv.Itoa(os.Getpid()))
	dp, err := datapath.Open(datapath.Config{PinDir: pinDir})
	if err != nil {
		return nil, err
	}
	defer func() {
		dp.Close()
		if _, err := node.Down(pinDir, true, 0, o.Log); err != nil {
			o.Log.Warn("removing bench datapath", "err", err)
		}
	}()
	if o.Conns > dp.ConnSlots() {
		return nil, fmt.Errorf("bench scrape: %d connections, the datapath has %d connection slots", o.Conns, dp.ConnSlots())
	}
	for _, p := range []*testbed.Pod{client, server} {
		if _, err := dp.Attach(p.Cgroup, p.CgroupID); err != nil {
			return nil, err
		}
	}
	set, err := serviceSet(o.Services, []netip.Addr{server.IPv4}, 8080)
	if err != nil {
		return nil, err
	}
	if _, err := dp.ApplyServices(set); err != nil {
		return nil, err
	}
	ports := (o.Conns + connsPerPort - 1) / connsPerPort
	var procs []*exec.Cmd
	defer func() {
		for _, c := range procs {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}()
	start := func(pod *testbed.Pod, want string, args ...string) error {
		cmd, err := pod.Command(self, args...)
		if err != nil {
			return err
		}
		errs, err := cmd.StderrPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("starting %v: %w", args, err)
		}
		procs = append(procs, cmd)
		return waitLine(ctx, errs, want, 5*time.Minute)
	}
	for i := range ports {
		if err := start(server, "listening", "peer", "sink", fmt.Sprintf("0.0.0.0:%d", 7000+i)); err != nil {
			return nil, err
		}
	}
	before, err := dp.Counters()
	if err != nil {
		return nil, err
	}
	// One client process per port: each within the open-file limit, and
	// each destination port with an ephemeral port range of its own.
	for i := range ports {
		n := min(connsPerPort, o.Conns-i*connsPerPort)
		if err := start(client, fmt.Sprintf("open %d", n), "peer", "open", "--ports", strconv.Itoa(7000+i), "--count", strconv.Itoa(n), server.IPv4.String()); err != nil {
			return nil, err
		}
	}
	rep := &ScrapeReport{Kernel: kernel(), Services: o.Services, Conns: o.Conns}
	// Kernel-side evidence: every connection joined, both ends in the map.
	deadline := time.Now().Add(time.Minute)
	for {
		if rep.BypassedSockets, err = dp.Sockets(); err != nil {
			return nil, err
		}
		if rep.BypassedSockets >= 2*o.Conns || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	after, err := dp.Counters()
	if err != nil {
		return nil, err
	}
	if n := after.Since(before).Get(datapath.CounterConnsBypassed); rep.BypassedSockets < 2*o.Conns || n < uint64(o.Conns) {
		return nil, fmt.Errorf("%d sockets in the bypass map and %d connections bypassed, want %d and %d", rep.BypassedSockets, n, 2*o.Conns, o.Conns)
	}
	col := metrics.New(dp, nil, nil, o.Log)
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)
	col.Refresh()
	for range o.Reps {
		t0 := time.Now()
		mfs, err := reg.Gather()
		if err != nil {
			return nil, fmt.Errorf("scraping: %w", err)
		}
		rep.ScrapeMs = append(rep.ScrapeMs, ms(time.Since(t0)))
		rep.Series = 0
		for _, mf := range mfs {
			rep.Series += len(mf.GetMetric())
		}
		t0 = time.Now()
		col.Refresh()
		rep.TableCountMs = append(rep.TableCountMs, ms(time.Since(t0)))
	}
	rep.ScrapeMedianMs, rep.CountMedianMs = median(rep.ScrapeMs), median(rep.TableCountMs)
	return rep, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// waitLine waits until r has a line starting with want.
func waitLine(ctx context.Context, r io.Reader, want string, limit time.Duration) error {
	found := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(r)
		var last string
		for sc.Scan() {
			last = sc.Text()
			if strings.HasPrefix(last, want) {
				found <- nil
				_, _ = io.Copy(io.Discard, r)
				return
			}
		}
		found <- fmt.Errorf("ended before %q (last: %q)", want, last)
	}()
	select {
	case err := <-found:
		return err
	case <-time.After(limit):
		return fmt.Errorf("no %q within %s", want, limit)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Text writes the report for people.
func (r *ScrapeReport) Text(w io.Writer) {
	fmt.Fprintf(w, "kernel %s: %d services, %d bypassed connections (%d sockets in the bypass map), %d series per scrape\n",
		r.Kernel, r.Services, r.Conns, r.BypassedSockets, r.Series)
	fmt.Fprintf(w, "scrape (counters, per-service series):  median %.2f ms over %d\n", r.ScrapeMedianMs, len(r.ScrapeMs))
	fmt.Fprintf(w, "table count (background, every 10 s):  median %.2f ms over %d\n", r.CountMedianMs, len(r.TableCountMs))
}
