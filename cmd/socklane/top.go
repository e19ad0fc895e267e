package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/top"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
)

func newTopCmd(g *globals) *cobra.Command {
	var interval time.Duration
	var rows, iterations int
	var batch bool
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Live view of the busiest bypassed connections and services",
		Long: `Shows, refreshed every --interval, the connections moving the most bytes
(per direction, bypass or TCP) and the services choosing the most backends.
In a terminal it is interactive (q quits, space pauses); with --batch, or
when the output is not a terminal, it prints one frame per interval
(-o json: one JSON object per line), --iterations times.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval < 100*time.Millisecond {
				return fmt.Errorf("--interval %s: want at least 100ms", interval)
			}
			if rows < 1 {
				return fmt.Errorf("--rows %d: want at least 1", rows)
			}
			dp, err := g.openPinned()
			if err != nil {
				return err
			}
			defer dp.Close()
			src := func() (top.Sample, error) { return sample(dp, g.name) }
			if _, err := unix.IoctlGetTermios(int(os.Stdout.Fd()), unix.TCGETS); err != nil {
				batch = true
			}
			if !batch {
				p := top.NewProgram(src, interval, rows)
				m, err := p.Run()
				if err != nil {
					return fmt.Errorf("running the terminal view: %w", err)
				}
				return top.Err(m)
			}
			ctx, stop := withTimeout(cmd.Context(), 0)
			defer stop()
			prev, err := src()
			if err != nil {
				return err
			}
			t := time.NewTicker(interval)
			defer t.Stop()
			for i := 0; iterations == 0 || i < iterations; i++ {
				select {
				case <-ctx.Done():
					return nil
				case <-t.C:
				}
				cur, err := src()
				if err != nil {
					return err
				}
				f := top.Compute(prev, cur, rows)
				prev = cur
				if g.json() {
					if err := json.NewEncoder(cmd.OutOrStdout()).Encode(f); err != nil {
						return err
					}
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), top.Render(f))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&interval, "interval", time.Second, "time between refreshes")
	f.IntVar(&rows, "rows", 20, "connections and services shown")
	f.BoolVar(&batch, "batch", false, "print frames instead of the interactive view")
	f.IntVar(&iterations, "iterations", 0, "with --batch: frames to print (0: until interrupted)")
	return cmd
}

// sample reads what one frame of top needs.
func sample(dp *datapath.Datapath, name string) (top.Sample, error) {
	s := top.Sample{At: time.Now()}
	var err error
	if s.Conns, err = dp.Conns(); err != nil {
		return s, err
	}
	if s.Counters, err = dp.Counters(); err != nil {
		return s, err
	}
	if s.Sockets, err = dp.Sockets(); err != nil {
		return s, err
	}
	if s.Services, err = dp.ServiceStats(); err != nil {
		return s, err
	}
	if s.Names, err = node.FrontendNames(name); err != nil {
		return s, err
	}
	return s, nil
}
