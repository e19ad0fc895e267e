package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func newConnsCmd(g *globals) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "conns",
		Short: "List bypassed connections with bytes each way and age",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dp, err := g.openPinned()
			if err != nil {
				return err
			}
			defer dp.Close()
			conns, err := dp.Conns()
			if err != nil {
				return err
			}
			if !all {
				kept := conns[:0]
				for _, c := range conns {
					if c.State == "bypass" {
						kept = append(kept, c)
					}
				}
				conns = kept
			}
			if g.json() {
				if conns == nil {
					return writeJSON(cmd.OutOrStdout(), []any{})
				}
				return writeJSON(cmd.OutOrStdout(), conns)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "CLIENT\tSERVER\tSTATE\tC->S PATH\tC->S BYTES\tS->C PATH\tS->C BYTES\tAGE")
			for _, c := range conns {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\n", c.Client, c.Server, c.State,
					c.ClientToServer.Path, c.ClientToServer.Bytes+c.ClientToServer.TCPBytes,
					c.ServerToClient.Path, c.ServerToClient.Bytes+c.ServerToClient.TCPBytes,
					c.Age.Round(time.Millisecond))
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "also list managed connections that stayed on TCP or are pending")
	return cmd
}
