package main

import (
	"fmt"
	"os"
	"time"

	"github.com/socklane/socklane/internal/conntable"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/pcap"
	"github.com/spf13/cobra"
)

func newCaptureCmd(g *globals) *cobra.Command {
	var file, cgroup string
	var port, pid, count int
	var snap, rate uint32
	var duration time.Duration
	cmd := &cobra.Command{
		Use:   "capture -w FILE.pcap",
		Short: "Record the payload of bypassed connections into a pcap file (tcpdump cannot see them)",
		Long: `Records bypassed messages into a pcap file of synthesized Ethernet/IP/TCP
segments with the connections' real addresses, ports and consistent
sequence numbers, readable with tcpdump -r and Wireshark. Each message keeps
its first --snap bytes; at most --rate messages per second per CPU are
recorded. Runs until interrupted, --count messages, or --duration; then it
reports what it missed. While it runs, captured connections get one verdict
per send (no verdict windows). Only bypassed traffic is recorded: what goes
over TCP is visible to tcpdump itself. One capture at a time.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return fmt.Errorf("give the output file with -w FILE.pcap")
			}
			if snap > datapath.MaxSnap {
				return fmt.Errorf("--snap %d: at most %d bytes", snap, datapath.MaxSnap)
			}
			if port < 0 || port > 65535 {
				return fmt.Errorf("--port %d: want 1 to 65535", port)
			}
			dp, err := g.openPinned()
			if err != nil {
				return err
			}
			defer dp.Close()
			cfg := datapath.CaptureConfig{Port: uint16(port), Snap: snap, Rate: rate}
			ns, err := conntable.Netns(pid, cgroup)
			if err != nil {
				return err
			}
			if len(ns) > 1 {
				return fmt.Errorf("--cgroup %s: its processes are in %d network namespaces; capture one pod at a time (or use --pid)", cgroup, len(ns))
			}
			for n := range ns {
				cfg.Netns = n
			}
			unlock, err := node.Exclusive(g.name, "capture")
			if err != nil {
				return err
			}
			defer unlock()
			// Other pods' payloads: readable by root only, also when
			// the file existed.
			f, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				return fmt.Errorf("creating %s: %w", file, err)
			}
			defer f.Close()
			if err := f.Chmod(0o600); err != nil {
				return fmt.Errorf("restricting %s to its owner: %w", file, err)
			}
			w, err := pcap.NewWriter(f)
			if err != nil {
				return err
			}
			ctx, stop := withTimeout(cmd.Context(), duration)
			defer stop()
			n, bytes := 0, uint64(0)
			ready := func() { fmt.Fprintf(cmd.ErrOrStderr(), "capturing bypassed traffic to %s; interrupt to stop\n", file) }
			loss, err := dp.Capture(ctx, cfg, ready, func(m datapath.CapturedMessage) error {
				if err := w.Write(pcap.Message{Time: m.Time, Src: m.Src, Dst: m.Dst, Conn: m.Conn, Dir: m.Dir,
					Offset: m.Offset, Len: m.Len, Payload: m.Payload}); err != nil {
					return err
				}
				n++
				bytes += uint64(m.Len)
				if count > 0 && n >= count {
					return datapath.ErrStop
				}
				return nil
			})
			if ferr := w.Flush(); err == nil {
				err = ferr
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "captured %d messages (%d bytes) to %s; missed %d (ring buffer full), %d (over --rate)\n",
				n, bytes, file, loss.RingFull, loss.RateLimited)
			return f.Close()
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&file, "write", "w", "", "pcap file to write")
	fl.IntVar(&port, "port", 0, "only connections with this port at either end")
	fl.IntVar(&pid, "pid", 0, "only connections with an end in this process's network namespace")
	fl.StringVar(&cgroup, "cgroup", "", "only connections with an end in this cgroup's (pod's) network namespace")
	fl.Uint32Var(&snap, "snap", 256, fmt.Sprintf("payload bytes kept per message (at most %d)", datapath.MaxSnap))
	fl.Uint32Var(&rate, "rate", 10000, "messages recorded per second per CPU at most (0: no limit)")
	fl.IntVar(&count, "count", 0, "stop after this many messages (0: until interrupted)")
	fl.DurationVar(&duration, "duration", 0, "stop after this long (0: until interrupted)")
	return cmd
}
