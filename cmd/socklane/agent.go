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
	var set settingsFlags
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
			return agent.Run(ctx, set.config(g, cgs), g.logger(os.Stderr))
		},
	}
	cmd.Flags().StringArrayVar(&cgs, "cgroup", nil, "cgroup v2 directory to attach to (repeatable; default: the cgroup v2 root)")
	set.add(cmd)
	cmd.SetContext(context.Background())
	return cmd
}
