package main

import (
	"fmt"

	"github.com/socklane/socklane/internal/node"
	"github.com/spf13/cobra"
)

// optOutSpec is the command of one opt-out of network namespaces.
type optOutSpec struct {
	kind        node.OptOut
	short, long string
	outVerb     string // said of a namespace opted out
	inVerb      string // said of one opted back in
}

// newSvcOptOutCmd opts network namespaces out of connect-time balancing.
func newSvcOptOutCmd(g *globals) *cobra.Command {
	return newOptOutCmd(g, optOutSpec{
		short: "Leave the service connects of network namespaces (/proc/PID/ns/net, /run/netns/NAME) to the node's per-packet proxy, as a service mesh needs; without arguments, list them",
		long: "Sockets of an opted-out network namespace connect to service addresses untranslated: kube-proxy\n" +
			"(or the node's other datapath) translates their packets, and a sidecar proxy sees the cluster IP.\n" +
			"The agent opts out the pods it attaches that carry the label " + node.OptOutLabel + "=off.",
		kind:    node.ServiceOptOut(),
		outVerb: "opted out",
		inVerb:  "balanced at connect() again",
	})
}

// newOptOutCmd is an `optout [NETNS...]` command for spec.
func newOptOutCmd(g *globals, spec optOutSpec) *cobra.Command {
	var undo bool
	cmd := &cobra.Command{
		Use:   "optout [NETNS...]",
		Short: spec.short,
		Long:  spec.long,
		RunE: func(cmd *cobra.Command, args []string) error {
			dp, err := g.openPinned()
			if err != nil {
				return err
			}
			defer dp.Close()
			if len(args) == 0 {
				out, err := spec.kind.List(dp)
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
				c, err := spec.kind.Apply(dp, ns, !undo)
				if err != nil {
					return err
				}
				verb := spec.outVerb
				if undo {
					verb = spec.inVerb
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s (netns cookie %d): %s\n", ns, c, verb)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&undo, "undo", false, "opt the namespaces back in")
	return cmd
}
