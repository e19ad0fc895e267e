package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/socklane/socklane/internal/peer"
	"github.com/spf13/cobra"
)

// newPeerCmd is the traffic program run inside pods by the tests, the demo
// and the benchmarks.
func newPeerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:    "peer",
		Short:  "Traffic program for tests and benchmarks (integrity streams, echo, ping-pong)",
		Hidden: true,
	}
	var cfg peer.IntegrityConfig
	var conns int
	addCfg := func(c *cobra.Command) {
		c.Flags().Int64Var(&cfg.Bytes, "bytes", 1<<20, "average bytes each side sends per connection")
		c.Flags().Int64Var(&cfg.SlowBytes, "slow-bytes", 16<<20, "bytes the client floods in slow-receiver mode")
		c.Flags().IntVar(&cfg.MaxMsg, "max-msg", 256<<10, "largest write; sizes are uniform in [1, max]")
		c.Flags().Uint64Var(&cfg.Seed, "seed", 1, "random seed")
		c.Flags().IntVar(&conns, "conns", 64, "connections")
		c.Flags().StringVar(&cfg.IO, "io", "mixed", "socket I/O: epoll, blocking, or mixed (alternating)")
	}
	ctx := func() (context.Context, context.CancelFunc) {
		return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	}
	server := &cobra.Command{
		Use:  "integrity-server ADDR",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := ctx()
			defer stop()
			ln, err := peer.Listen(args[0], cfg.IO != "blocking")
			if err != nil {
				return err
			}
			fmt.Fprintln(os.Stderr, "listening", args[0])
			sum := peer.Serve(ctx, ln, cfg, conns, os.Stdout)
			if sum.Failed > 0 {
				return fmt.Errorf("%d of %d connections failed verification", sum.Failed, sum.Conns)
			}
			return nil
		},
	}
	client := &cobra.Command{
		Use:  "integrity-client ADDR:PORT",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := ctx()
			defer stop()
			target, err := netip.ParseAddrPort(args[0])
			if err != nil {
				return err
			}
			sum := peer.Dial(ctx, target, cfg, conns, os.Stdout)
			if sum.Failed > 0 {
				return fmt.Errorf("%d of %d connections failed verification", sum.Failed, sum.Conns)
			}
			return nil
		},
	}
	addCfg(server)
	addCfg(client)
	echo := &cobra.Command{
		Use:  "echo ADDR",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := ctx()
			defer stop()
			ln, err := net.Listen("tcp", args[0])
			if err != nil {
				return err
			}
			fmt.Fprintln(os.Stderr, "listening", ln.Addr())
			return peer.Echo(ctx, ln)
		},
	}
	var size, count, warmup int
	pingpong := &cobra.Command{
		Use:  "pingpong ADDR:PORT",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := ctx()
			defer stop()
			target, err := netip.ParseAddrPort(args[0])
			if err != nil {
				return err
			}
			l, err := peer.PingPong(ctx, target, size, count, warmup)
			if err != nil {
				return err
			}
			return json.NewEncoder(os.Stdout).Encode(l)
		},
	}
	pingpong.Flags().IntVar(&size, "size", 64, "message size")
	pingpong.Flags().IntVar(&count, "count", 10000, "round trips measured")
	pingpong.Flags().IntVar(&warmup, "warmup", 100, "round trips before measuring")
	cmd.AddCommand(server, client, echo, pingpong)
	return cmd
}
