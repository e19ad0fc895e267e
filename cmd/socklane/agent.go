package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/socklane/socklane/internal/agent"
	"github.com/spf13/cobra"
)

func newAgentCmd(g *globals) *cobra.Command {
	var cgs []string
	var backlog uint32
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the node agent in the foreground (loads or adopts the datapath and attaches it)",
		Long: `Runs the node agent. It checks the kernel, mounts bpffs if needed, loads the
datapath (or adopts the one already pinned) and attaches it to the cgroup v2
root, or to the cgroups given with --cgroup. Stopping or killing the agent
leaves the datapath in place: live connections are not touched. Remove
socklane with 'socklane down'.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return agent.Run(ctx, agent.Config{BPFFS: g.bpffs, PinName: g.name, Cgroups: cgs, BacklogLimit: backlog}, g.logger(os.Stderr))
		},
	}
	cmd.Flags().StringArrayVar(&cgs, "cgroup", nil, "cgroup v2 directory to attach to (repeatable; default: the cgroup v2 root)")
	cmd.Flags().Uint32Var(&backlog, "backlog-limit", 0, "receiver backlog in bytes above which a bypassed direction moves to TCP (0: net.ipv4.tcp_rmem max)")
	cmd.SetContext(context.Background())
	return cmd
}
