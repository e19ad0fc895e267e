package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"text/tabwriter"
	"time"

	"github.com/socklane/socklane/internal/conntable"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/spf13/cobra"
)

func newConnsCmd(g *globals) *cobra.Command {
	var f conntable.Filter
	var pid, port, count int
	var cgroup, addr, sortKey string
	var watch bool
	var interval time.Duration
	cmd := &cobra.Command{
		Use:   "conns",
		Short: "List bypassed connections: bytes and messages each way, path, state, age",
		Long: `Lists the connections the datapath manages. Filters: --pid or --cgroup (a
pod: connections with an end in its network namespace), --port and --addr
(either end). --watch reprints every --interval (JSON: one array per line).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := conntable.Sort(nil, sortKey); err != nil {
				return err
			}
			if port < 0 || port > 65535 {
				return fmt.Errorf("--port %d: want 1 to 65535", port)
			}
			f.Port = uint16(port)
			if addr != "" {
				a, err := netip.ParseAddr(addr)
				if err != nil {
					return fmt.Errorf("--addr %q: %w", addr, err)
				}
				f.Addr = a.Unmap()
			}
			if watch && interval < 10*time.Millisecond {
				return fmt.Errorf("--interval %s: want at least 10ms", interval)
			}
			dp, err := g.openPinned()
			if err != nil {
				return err
			}
			defer dp.Close()
			if f.Netns, err = conntable.Netns(pid, cgroup); err != nil {
				return err
			}
			show := func() error {
				conns, err := dp.Conns()
				if err != nil {
					return err
				}
				conns = f.Apply(conns)
				if err := conntable.Sort(conns, sortKey); err != nil {
					return err
				}
				if g.json() {
					if conns == nil {
						conns = []datapath.Conn{}
					}
					if watch {
						return json.NewEncoder(cmd.OutOrStdout()).Encode(conns)
					}
					return writeJSON(cmd.OutOrStdout(), conns)
				}
				return connsTable(cmd.OutOrStdout(), conns, watch)
			}
			if !watch {
				return show()
			}
			ctx, stop := withTimeout(cmd.Context(), 0)
			defer stop()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for i := 0; count == 0 || i < count; i++ {
				if i > 0 {
					select {
					case <-ctx.Done():
						return nil
					case <-tick.C:
					}
				}
				if err := show(); err != nil {
					return err
				}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&f.All, "all", false, "also list managed connections that stayed on TCP or are pending")
	fl.IntVar(&pid, "pid", 0, "only connections with an end in this process's network namespace")
	fl.StringVar(&cgroup, "cgroup", "", "only connections with an end in the network namespace of this cgroup's processes (a pod)")
	fl.IntVar(&port, "port", 0, "only connections with this port at either end")
	fl.StringVar(&addr, "addr", "", "only connections with this address at either end")
	fl.StringVar(&sortKey, "sort", "age", "order: age (oldest first), bytes (most first), client, server")
	fl.BoolVarP(&watch, "watch", "w", false, "reprint every --interval until interrupted (or --count times)")
	fl.DurationVar(&interval, "interval", time.Second, "with --watch: time between listings")
	fl.IntVar(&count, "count", 0, "with --watch: stop after this many listings (0: until interrupted)")
	return cmd
}

func connsTable(out io.Writer, conns []datapath.Conn, stamped bool) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	if stamped {
		fmt.Fprintf(w, "%s\t%d connections\n", time.Now().Format(time.TimeOnly), len(conns))
	}
	fmt.Fprintln(w, "CLIENT\tSERVER\tSTATE\tC->S PATH\tC->S BYTES\tC->S MSGS\tS->C PATH\tS->C BYTES\tS->C MSGS\tAGE")
	for _, c := range conns {
		cs, sc := c.ClientToServer, c.ServerToClient
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%d\t%d\t%s\n", c.Client, c.Server, c.State,
			cs.Path, cs.Bytes+cs.TCPBytes, cs.Msgs+cs.TCPMsgs,
			sc.Path, sc.Bytes+sc.TCPBytes, sc.Msgs+sc.TCPMsgs,
			c.Age.Round(time.Millisecond))
	}
	return w.Flush()
}
