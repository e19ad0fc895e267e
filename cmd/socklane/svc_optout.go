package main

import (
	"fmt"

	"github.com/socklane/socklane/internal/node"
	"github.com/spf13/cobra"
)

// newSvcOptOutCmd opts network namespaces out of connect-time balancing.
func newSvcOptOutCmd(g *globals) *cobra.Command {
	var undo bool
	cmd := &cobra.Command{
		Use:   "optout [NETNS...]",
		Short: "Leave the service connects of network namespaces (/proc/PID/ns/net, /run/netns/NAME) to the node's per-packet proxy, as a service mesh needs; without arguments, list them",
		Long: "Sockets of an opted-out network namespace connect to service addresses untranslated: kube-proxy\n" +
			"(or the node's other datapath) translates their packets, and a sidecar proxy sees the cluster IP.\n" +
			"The agent opts out the pods it attaches that carry the label " + node.OptOutLabel + "=off.",
		RunE: func(cmd *cobra.Command, args []string) error {
			dp, err := g.openPinned()
			if err != nil {
				return err
			}
			defer dp.Close()
			if len(args) == 0 {
				out, err := dp.ServiceOptOuts()
				if err != nil {
					return err
				}
				if g.json() {
					return writeJSON(cmd.OutOrStdout(), map[string]any{"netns": out})
				}
				for _, c := range out {
					fmt.Fprintf(cmd.OutOrStdout(), "netns cookie %d\n", c)
				}
				return nil
			}
			for _, ns := range args {
				c, err := node.ServiceOptOut(dp, ns, !undo)
				if err != nil {
					return err
				}
				verb := "opted out"
				if undo {
					verb = "balanced at connect() again"
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s (netns cookie %d): %s\n", ns, c, verb)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&undo, "undo", false, "opt the namespaces back in")
	return cmd
}
