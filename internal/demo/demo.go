// Package demo sets up two pods on a node bridge and shows the bypass at
// work: round-trip times with and without it, side by side, and the kernel
// counters that prove which path the bytes took.
package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/peer"
	"github.com/socklane/socklane/internal/testbed"
)

// Options of a demo run.
type Options struct {
	BPFFS  string
	Rounds int // interleaved off/on rounds
	Count  int // round trips per measurement
	Sizes  []int
	Log    *slog.Logger
}

// Run runs the demo and writes its report to w.
func Run(ctx context.Context, w io.Writer, o Options) error {
	if _, err := node.Preflight(o.BPFFS, nil); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding own executable: %w", err)
	}
	bed, err := testbed.New()
	if err != nil {
		return fmt.Errorf("creating pods: %w", err)
	}
	defer func() {
		if err := bed.Close(); err != nil {
			o.Log.Warn("cleaning up pods", "err", err)
		}
	}()
	client, err := bed.AddPod("client")
	if err != nil {
		return err
	}
	server, err := bed.AddPod("server")
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "pods: client %s (cgroup %s), server %s, bridge %s, bridge-nf-call-iptables=%v\n",
		client.IPv4, filepath.Base(client.Cgroup), server.IPv4, bed.Bridge, testbed.BridgeNetfilter())

	pinDir := filepath.Join(o.BPFFS, "socklane-demo-"+strconv.Itoa(os.Getpid()))
	// The demo shows the bypass: it is on whatever --bypass auto would
	// decide on this kernel, which the report says.
	settings := datapath.DefaultSettings()
	settings.Bypass = datapath.ModeOn
	dp, err := datapath.Open(datapath.Config{PinDir: pinDir, Settings: settings})
	if err != nil {
		return err
	}
	defer func() {
		dp.Close()
		if _, err := node.Down(pinDir, true, 0, o.Log); err != nil {
			o.Log.Warn("removing demo datapath", "err", err)
		}
	}()
	if auto := datapath.DefaultSettings().Resolve(dp.Features()); !auto.Bypass.On() {
		fmt.Fprintln(w, "note: on this kernel the agent's default (--bypass auto) leaves the bypass off; the demo turns it on to show it:")
		for _, why := range dp.Features().Decided(auto) {
			fmt.Fprintln(w, "  "+why)
		}
	}

	// Echo server pinned to CPU 0, like the client: one-CPU placement.
	echo, err := server.Command("taskset", "-c", "0", self, "peer", "echo", "0.0.0.0:7000")
	if err != nil {
		return err
	}
	if err := echo.Start(); err != nil {
		return fmt.Errorf("starting echo server: %w", err)
	}
	defer func() { _ = echo.Process.Kill(); _ = echo.Wait() }()
	target := netip.AddrPortFrom(server.IPv4, 7000)
	if err := waitListening(ctx, client, self, target); err != nil {
		return err
	}

	type sample struct{ off, on []peer.Latency }
	results := make([]sample, len(o.Sizes))
	var redirected uint64
	for round := 0; round < o.Rounds; round++ {
		for i, size := range o.Sizes {
			for _, on := range []bool{false, true} {
				if on {
					for _, p := range []*testbed.Pod{client, server} {
						if _, err := dp.Attach(p.Cgroup, p.CgroupID); err != nil {
							return err
						}
					}
				} else if _, err := dp.DetachAll(); err != nil {
					return err
				}
				before, err := dp.Counters()
				if err != nil {
					return err
				}
				l, err := pingpong(ctx, client, self, target, size, o.Count)
				if err != nil {
					return err
				}
				after, err := dp.Counters()
				if err != nil {
					return err
				}
				// Bytes, not messages: under verdict windows one verdict
				// covers many sends. The echo moves size bytes each way
				// per round trip; a closed connection's count is exact.
				moved := after.Since(before).Get(datapath.CounterRedirectBytes)
				if on {
					results[i].on = append(results[i].on, l)
					redirected += moved
					if want := uint64(2 * size * o.Count); moved < want {
						return fmt.Errorf("bypass on, but only %d bytes redirected for %d round trips of %d bytes (want at least %d)", moved, o.Count, size, want)
					}
				} else {
					results[i].off = append(results[i].off, l)
					if moved != 0 {
						return fmt.Errorf("bypass off, yet %d bytes were redirected", moved)
					}
				}
			}
		}
	}
	_, _ = dp.DetachAll()

	fmt.Fprintf(w, "\nround-trip time, pod to pod over the bridge, client and server on CPU 0, %d round trips x %d interleaved rounds (medians)\n\n", o.Count, o.Rounds)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "size\tTCP mean us\tbypass mean us\tratio\tTCP p99 us\tbypass p99 us\t")
	for i, size := range o.Sizes {
		off, on := median(results[i].off, meanOf), median(results[i].on, meanOf)
		offP99, onP99 := median(results[i].off, p99Of), median(results[i].on, p99Of)
		fmt.Fprintf(tw, "%d\t%.1f\t%.1f\t%.2f\t%.1f\t%.1f\t\n", size, off, on, on/off, offP99, onP99)
	}
	tw.Flush()
	c, err := dp.Counters()
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\nkernel counters: %d bytes redirected socket to socket under %d verdicts, %d connections bypassed, %d messages passed to TCP\n",
		c.Get(datapath.CounterRedirectBytes), c.Get(datapath.CounterRedirectMsgs), c.Get(datapath.CounterConnsBypassed), c.Get(datapath.CounterPassMsgs))
	if redirected == 0 {
		return errors.New("no message was redirected")
	}
	return nil
}

func meanOf(l peer.Latency) float64 { return l.Mean }
func p99Of(l peer.Latency) float64  { return l.P99 }

func median(ls []peer.Latency, f func(peer.Latency) float64) float64 {
	v := make([]float64, len(ls))
	for i, l := range ls {
		v[i] = f(l)
	}
	slices.Sort(v)
	if len(v) == 0 {
		return 0
	}
	return v[len(v)/2]
}

func pingpong(ctx context.Context, p *testbed.Pod, self string, target netip.AddrPort, size, count int) (peer.Latency, error) {
	cmd, err := p.Command("taskset", "-c", "0", self, "peer", "pingpong", target.String(),
		"--size", strconv.Itoa(size), "--count", strconv.Itoa(count), "--warmup", "200")
	if err != nil {
		return peer.Latency{}, err
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := runTimeout(ctx, cmd, 2*time.Minute); err != nil {
		return peer.Latency{}, fmt.Errorf("ping-pong: %w: %s", err, errb.String())
	}
	var l peer.Latency
	if err := json.Unmarshal(out.Bytes(), &l); err != nil {
		return l, fmt.Errorf("parsing ping-pong output %q: %w", out.String(), err)
	}
	return l, nil
}

func runTimeout(ctx context.Context, cmd *exec.Cmd, d time.Duration) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
	case <-ctx.Done():
	}
	_ = cmd.Process.Kill()
	return fmt.Errorf("%s did not finish in %s (%v)", cmd.Path, d, <-done)
}

// waitListening retries a tiny ping-pong until the server answers.
func waitListening(ctx context.Context, p *testbed.Pod, self string, target netip.AddrPort) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := pingpong(ctx, p, self, target, 1, 1)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("server at %s never answered: %w", target, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
