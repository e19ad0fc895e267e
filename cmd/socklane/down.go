package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/socklane/socklane/internal/bpffs"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/node"
	"github.com/spf13/cobra"
)

func newDownCmd(g *globals) *cobra.Command {
	var force, ignoreNotFound bool
	var drain time.Duration
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Remove socklane from the node, letting bypassed connections drain first",
		Long: `Detaches the bypass everywhere (new connections use plain TCP), waits for the
connections already bypassed to close, then removes the pinned datapath.

--force removes it at once. Live bypassed connections then continue over TCP,
but bytes that were redirected to a socket and not yet read by its
application are dropped by the kernel.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := node.RequireRoot(); err != nil {
				return err
			}
			if err := bpffs.Require(g.bpffs); err != nil {
				return err
			}
			live, err := node.Down(g.pinDir(), force, drain, g.logger(os.Stderr))
			if errors.Is(err, datapath.ErrNotPinned) {
				if ignoreNotFound {
					fmt.Fprintf(cmd.ErrOrStderr(), "no socklane instance %q at %s: nothing to remove\n", g.name, g.pinDir())
					return nil
				}
				return fmt.Errorf("no socklane instance %q on this node (nothing pinned at %s): check --name and --bpffs, or pass --ignore-not-found", g.name, g.pinDir())
			}
			if err != nil {
				return err
			}
			if live > 0 {
				return &exitError{code: 3, err: fmt.Errorf("%d bypassed sockets are still open after %s: socklane is detached (no new connection is bypassed) but left pinned at %s so their bytes are kept; run `socklane down` again later, or `socklane down --force` to drop it now", live, drain, g.pinDir())}
			}
			if g.json() {
				return writeJSON(cmd.OutOrStdout(), map[string]any{"removed": g.pinDir()})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "socklane removed (%s)\n", g.pinDir())
			return nil
		},
	}
	cmd.Flags().BoolVar(&ignoreNotFound, "ignore-not-found", false, "succeed when there is no instance to remove")
	cmd.Flags().BoolVar(&force, "force", false, "remove at once, without waiting for bypassed connections to close")
	cmd.Flags().DurationVar(&drain, "drain-timeout", time.Minute, "how long to wait for bypassed connections to close")
	return cmd
}
