package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/socklane/socklane/internal/agent"
	"github.com/socklane/socklane/internal/cgroups"
	"github.com/socklane/socklane/internal/cri"
	"github.com/spf13/cobra"
)

// targetFlags selects cgroups: by path, by a process in it, or by pod
// (and container) or label selector through the container runtime.
type targetFlags struct {
	cgroup    string
	pid       int
	pod       string
	container string
	selector  string
	criSocket string
}

func (t *targetFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&t.cgroup, "cgroup", "", "cgroup v2 directory (absolute, or relative to the cgroup v2 root)")
	cmd.Flags().IntVar(&t.pid, "pid", 0, "process whose cgroup to use")
	cmd.Flags().StringVar(&t.pod, "pod", "", "pod NAMESPACE/NAME, found through the container runtime (CRI)")
	cmd.Flags().StringVar(&t.container, "container", "", "with --pod: only this container of the pod")
	cmd.Flags().StringVar(&t.selector, "selector", "", "every running pod whose labels match key=value[,key=value]")
	cmd.Flags().StringVar(&t.criSocket, "cri-socket", cri.DefaultSocket, "the container runtime's CRI socket")
}

func (t *targetFlags) resolve(ctx context.Context) ([]agent.Target, error) {
	n := 0
	for _, set := range []bool{t.cgroup != "", t.pid != 0, t.pod != "", t.selector != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		return nil, errors.New("give exactly one of --cgroup PATH, --pid PID, --pod NAMESPACE/NAME or --selector KEY=VALUE")
	}
	if t.container != "" && t.pod == "" {
		return nil, errors.New("--container needs --pod")
	}
	root, err := cgroups.Root()
	if err != nil {
		return nil, err
	}
	var paths []string
	switch {
	case t.cgroup != "":
		paths = []string{t.cgroup}
	case t.pid != 0:
		if t.pid < 0 {
			return nil, fmt.Errorf("invalid --pid %d", t.pid)
		}
		path, err := cgroups.OfPID(root, t.pid)
		if err != nil {
			return nil, err
		}
		paths = []string{path}
	default:
		if paths, err = t.podCgroups(ctx); err != nil {
			return nil, err
		}
	}
	var out []agent.Target
	for _, path := range paths {
		p, id, err := cgroups.Resolve(root, path)
		if err != nil {
			return nil, err
		}
		out = append(out, agent.Target{Path: p, ID: id})
	}
	return out, nil
}

// podCgroups resolves --pod/--container or --selector through the CRI.
func (t *targetFlags) podCgroups(ctx context.Context) ([]string, error) {
	var sel cri.Selector
	if t.selector != "" {
		var err error
		if sel, err = cri.ParseSelector(t.selector); err != nil {
			return nil, err
		}
	}
	c, err := cri.Dial(ctx, t.criSocket)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	pods, err := c.Pods(ctx)
	if err != nil {
		return nil, err
	}
	if sel != nil {
		var paths []string
		for _, p := range cri.Select(pods, sel) {
			if p.Cgroup != "" {
				paths = append(paths, p.Cgroup)
			}
		}
		if len(paths) == 0 {
			return nil, fmt.Errorf("no running pod matches %s", t.selector)
		}
		return paths, nil
	}
	p, err := cri.Find(pods, t.pod)
	if err != nil {
		return nil, err
	}
	if t.container == "" {
		if p.Cgroup == "" {
			return nil, fmt.Errorf("pod %s has no cgroup yet (no running container)", p.Key())
		}
		return []string{p.Cgroup}, nil
	}
	var names []string
	for _, k := range p.Containers {
		if k.Name == t.container {
			if k.Cgroup == "" {
				return nil, fmt.Errorf("container %s of pod %s is not running", k.Name, p.Key())
			}
			return []string{k.Cgroup}, nil
		}
		names = append(names, k.Name)
	}
	return nil, fmt.Errorf("pod %s has no container %s (it has: %s)", p.Key(), t.container, strings.Join(names, ", "))
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
			targets, err := t.resolve(cmd.Context())
			if err != nil {
				return err
			}
			var paths []string
			for _, tg := range targets {
				paths = append(paths, tg.Path)
			}
			dp, err := agent.Start(set.config(g, paths), g.logger(os.Stderr))
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
			targets, err := t.resolve(cmd.Context())
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
			agent.Reclaim(dp, g.logger(os.Stderr))
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
