package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/socklane/socklane/internal/agent"
	"github.com/socklane/socklane/internal/cgroups"
	"github.com/spf13/cobra"
)

// targetFlags selects a cgroup by path or by a process in it.
type targetFlags struct {
	cgroup string
	pid    int
}

func (t *targetFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&t.cgroup, "cgroup", "", "cgroup v2 directory (absolute, or relative to the cgroup v2 root)")
	cmd.Flags().IntVar(&t.pid, "pid", 0, "process whose cgroup to use")
}

func (t *targetFlags) resolve() (agent.Target, error) {
	if (t.cgroup == "") == (t.pid == 0) {
		return agent.Target{}, errors.New("give exactly one of --cgroup PATH or --pid PID")
	}
	root, err := cgroups.Root()
	if err != nil {
		return agent.Target{}, err
	}
	path := t.cgroup
	if t.pid != 0 {
		if t.pid < 0 {
			return agent.Target{}, fmt.Errorf("invalid --pid %d", t.pid)
		}
		if path, err = cgroups.OfPID(root, t.pid); err != nil {
			return agent.Target{}, err
		}
	}
	p, id, err := cgroups.Resolve(root, path)
	if err != nil {
		return agent.Target{}, err
	}
	return agent.Target{Path: p, ID: id}, nil
}

func newAttachCmd(g *globals) *cobra.Command {
	var t targetFlags
	var set settingsFlags
	cmd := &cobra.Command{
		Use:   "attach",
		Short: "Attach the bypass to a cgroup (loads the datapath if it is not running)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := agent.RequireRoot(); err != nil {
				return err
			}
			if err := set.config(g, nil).Validate(); err != nil {
				return err
			}
			target, err := t.resolve()
			if err != nil {
				return err
			}
			dp, err := agent.Start(set.config(g, []string{target.Path}), g.logger(os.Stderr))
			if err != nil {
				return err
			}
			defer dp.Close()
			if g.json() {
				return writeJSON(cmd.OutOrStdout(), map[string]any{"attached": target.Path, "cgroup_id": target.ID})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "attached %s (cgroup id %d)\n", target.Path, target.ID)
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
			target, err := t.resolve()
			if err != nil {
				return err
			}
			ok, err := dp.Detach(target.ID)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("socklane is not attached to %s", target.Path)
			}
			if g.json() {
				return writeJSON(cmd.OutOrStdout(), map[string]any{"detached": target.Path, "cgroup_id": target.ID})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "detached %s\n", target.Path)
			return nil
		},
	}
	t.add(cmd)
	return cmd
}
