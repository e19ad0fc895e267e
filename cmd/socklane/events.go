package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"time"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/node"
	"github.com/spf13/cobra"
)

func newEventsCmd(g *globals) *cobra.Command {
	var types []string
	var port, count int
	var addr string
	var duration time.Duration
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Stream datapath events: connections established, bypassed, fallen back (and why), closed; service selections",
		Long: `Turns the datapath's event stream on and prints each event as it happens
(one line each; -o json: one JSON object per line) until interrupted, or
--count events, or --duration. Events dropped because the ring buffer was
full are reported as "lost" lines. One reader at a time.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, t := range types {
				if !slices.Contains(datapath.EventTypes(), t) {
					return fmt.Errorf("--type %q: want some of %v", t, datapath.EventTypes())
				}
			}
			if port < 0 || port > 65535 {
				return fmt.Errorf("--port %d: want 1 to 65535", port)
			}
			var want netip.Addr
			if addr != "" {
				a, err := netip.ParseAddr(addr)
				if err != nil {
					return fmt.Errorf("--addr %q: %w", addr, err)
				}
				want = a.Unmap()
			}
			dp, err := g.openPinned()
			if err != nil {
				return err
			}
			defer dp.Close()
			unlock, err := node.Exclusive(g.name, "events")
			if err != nil {
				return err
			}
			defer unlock()
			ctx, stop := withTimeout(cmd.Context(), duration)
			defer stop()
			out := cmd.OutOrStdout()
			enc := json.NewEncoder(out)
			n := 0
			ready := func() { fmt.Fprintln(cmd.ErrOrStderr(), "reading events; interrupt to stop") }
			// Policy ids are named from the applied set, read again
			// when an id is new to it.
			var policyNames, workloadNames map[uint32]string
			return dp.Events(ctx, ready, func(e datapath.Event) error {
				if e.Type == "ports_exhausted" {
					if _, ok := workloadNames[e.WorkloadID]; !ok {
						if rec, err := node.AppliedPorts(g.name); err == nil {
							workloadNames = rec.WorkloadNames()
						}
					}
					e.Workload = workloadNames[e.WorkloadID]
				}
				if e.Type == "policy_denied" {
					if _, ok := policyNames[e.Policy]; !ok {
						policyNames, _ = node.PolicyNames(g.name)
					}
					e.PolicyName = policyNames[e.Policy]
				}
				if e.Type != "lost" {
					if len(types) > 0 && !slices.Contains(types, e.Type) {
						return nil
					}
					if port != 0 && e.Src.Port() != uint16(port) && e.Dst.Port() != uint16(port) {
						return nil
					}
					if want.IsValid() && e.Src.Addr() != want && e.Dst.Addr() != want {
						return nil
					}
				}
				var err error
				if g.json() {
					err = enc.Encode(e)
				} else {
					err = printEvent(out, e)
				}
				if err != nil {
					return err
				}
				if n++; count > 0 && n >= count {
					return datapath.ErrStop
				}
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&types, "type", nil, "only these event types: established, bypass, tcp, fallback, closed, lb_select, lb_refused, policy_denied, ports_exhausted, lost")
	f.IntVar(&port, "port", 0, "only events with this port at either end")
	f.StringVar(&addr, "addr", "", "only events with this address at either end")
	f.IntVar(&count, "count", 0, "stop after this many events (0: until interrupted)")
	f.DurationVar(&duration, "duration", 0, "stop after this long (0: until interrupted)")
	return cmd
}

func printEvent(w io.Writer, e datapath.Event) error {
	ts := e.Time.Format("15:04:05.000000")
	var err error
	switch e.Type {
	case "lost":
		_, err = fmt.Fprintf(w, "%s lost      %d events (the ring buffer was full)\n", ts, e.Count)
	case "closed":
		_, err = fmt.Fprintf(w, "%s closed    %s -> %s %s end; c->s %d B in %d msgs, s->c %d B in %d msgs\n",
			ts, e.Src, e.Dst, e.Role, e.Bytes[0], e.Msgs[0], e.Bytes[1], e.Msgs[1])
	case "fallback", "tcp":
		_, err = fmt.Fprintf(w, "%s %-9s %s -> %s %s: %s\n", ts, e.Type, e.Src, e.Dst, e.Dir, e.Reason)
	case "lb_select":
		_, err = fmt.Fprintf(w, "%s lb_select %s %s -> backend %s\n", ts, e.Proto, e.Src, e.Dst)
	case "policy_denied":
		_, err = fmt.Fprintf(w, "%s policy_denied %s %s -> %s by %s of %s (identities %d -> %d)\n", ts, e.Proto, e.Src, e.Dst, e.Dir, e.PolicyName, e.SrcIdentity, e.DstIdentity)
	case "ports_exhausted":
		_, err = fmt.Fprintf(w, "%s ports_exhausted %s virtual port %d of workload %s (id %d): no free port in its pool\n", ts, e.Proto, e.Dst.Port(), e.Workload, e.WorkloadID)
	case "lb_refused":
		_, err = fmt.Fprintf(w, "%s lb_refused %s %s: no backend\n", ts, e.Proto, e.Src)
	default:
		_, err = fmt.Fprintf(w, "%s %-9s %s -> %s\n", ts, e.Type, e.Src, e.Dst)
	}
	return err
}
