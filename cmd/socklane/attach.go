package main

import (
	"fmt"
	"os"

	"github.com/socklane/socklane/internal/cri"
	"github.com/socklane/socklane/internal/node"
	"github.com/spf13/cobra"
)

// targetFlags select cgroups: by path, by a process in it, or by pod
// (and container) or label selector through the container runtime.
type targetFlags struct{ sel node.Selection }

func (t *targetFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&t.sel.Cgroup, "cgroup", "", "cgroup v2 directory (absolute, or relative to the cgroup v2 root)")
	cmd.Flags().IntVar(&t.sel.PID, "pid", 0, "process whose cgroup to use")
	cmd.Flags().StringVar(&t.sel.Pod, "pod", "", "pod NAMESPACE/NAME, found through the container runtime (CRI)")
	cmd.Flags().StringVar(&t.sel.Container, "container", "", "with --pod: only this container of the pod")
	cmd.Flags().StringVar(&t.sel.Selector, "selector", "", "every running pod whose labels match key=value[,key=value]")
	cmd.Flags().StringVar(&t.sel.CRISocket, "cri-socket", cri.DefaultSocket, "the container runtime's CRI socket")
}

func newAttachCmd(g *globals) *cobra.Command {
	var t targetFlags
	var set settingsFlags
	cmd := &cobra.Command{
		Use:   "attach",
		Short: "Attach the bypass to a cgroup (loads the datapath if it is not running)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := node.RequireRoot(); err != nil {
				return err
			}
			cfg := set.config(g)
			if err := cfg.Settings.Validate(); err != nil {
				return err
			}
			targets, err := t.sel.Targets(cmd.Context())
			if err != nil {
				return err
			}
			var paths []string
			for _, tg := range targets {
				paths = append(paths, tg.Path)
			}
			dp, targets, err := node.Start(cfg, paths, g.logger(os.Stderr))
			if err != nil {
				return err
			}
			defer dp.Close()
			if g.json() {
				return writeJSON(cmd.OutOrStdout(), map[string]any{"attached": targets})
			}
			for _, tg := range targets {
				fmt.Fprintf(cmd.OutOrStdout(), "attached %s (cgroup id %d)\n", tg.Path, tg.ID)
			}
			return nil
		},
	}
	t.add(cmd)
	set.add(cmd)
	return cmd
}

func newDetachCmd(g *globals) *cobra.Command {
	var t targetFlags
	cmd := &cobra.Command{
		Use:   "detach",
		Short: "Detach the bypass from a cgroup (live bypassed connections keep it until they close)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dp, err := g.openPinned()
			if err != nil {
				return err
			}
			defer dp.Close()
			targets, err := t.sel.Targets(cmd.Context())
			if err != nil {
				return err
			}
			for _, target := range targets {
				ok, err := dp.Detach(target.ID)
				if err != nil {
					return err
				}
				if !ok {
					return fmt.Errorf("socklane is not attached to %s", target.Path)
				}
			}
			// What sockets of earlier detached cgroups left behind; the
			// agent's sweep reclaims the ones still open later.
			node.Reclaim(dp, g.logger(os.Stderr))
			if g.json() {
				return writeJSON(cmd.OutOrStdout(), map[string]any{"detached": targets})
			}
			for _, target := range targets {
				fmt.Fprintf(cmd.OutOrStdout(), "detached %s\n", target.Path)
			}
			return nil
		},
	}
	t.add(cmd)
	return cmd
}
