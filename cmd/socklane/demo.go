package main

import (
	"os"

	"github.com/socklane/socklane/internal/demo"
	"github.com/spf13/cobra"
)

func newDemoCmd(g *globals) *cobra.Command {
	o := demo.Options{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Set up two pods and show the bypass working, with round-trip times off and on",
		Long: `Creates two pods (network namespaces on a bridge with bridge-nf on, each in
its own cgroup), runs an echo server in one and a ping-pong client in the
other, and measures round trips with plain TCP and with the bypass,
interleaved. Kernel counters prove which path the bytes took. Everything it
creates is removed when it ends. It uses its own datapath instance and never
touches a running agent's.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.BPFFS = g.bpffs
			o.Log = g.logger(os.Stderr)
			return demo.Run(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().IntVar(&o.Rounds, "rounds", 3, "interleaved off/on rounds")
	cmd.Flags().IntVar(&o.Count, "count", 5000, "round trips per measurement")
	cmd.Flags().IntSliceVar(&o.Sizes, "sizes", []int{1, 64, 1024, 16384}, "message sizes")
	return cmd
}
