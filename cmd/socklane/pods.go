package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/socklane/socklane/internal/cgroups"
	"github.com/socklane/socklane/internal/cri"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/spf13/cobra"
)

// podView is a pod with what socklane manages of it.
type podView struct {
	cri.Pod
	// Managed: socklane is attached to the pod's cgroup or one above it.
	Managed bool `json:"managed"`
}

func newPodsCmd(g *globals) *cobra.Command {
	var socket string
	cmd := &cobra.Command{
		Use:   "pods",
		Short: "List the node's pods (through the container runtime) and which ones socklane manages",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := cri.Dial(cmd.Context(), socket)
			if err != nil {
				return err
			}
			defer c.Close()
			pods, err := c.Pods(cmd.Context())
			if err != nil {
				return err
			}
			attached := map[uint64]bool{}
			if datapath.Pinned(g.pinDir()) {
				atts, err := datapath.Pins(g.pinDir()).Attachments()
				if err != nil {
					return err
				}
				for _, a := range atts {
					attached[a.CgroupID] = true
				}
			}
			root, err := cgroups.Root()
			if err != nil {
				return err
			}
			views := []podView{}
			for _, p := range pods {
				views = append(views, podView{Pod: p, Managed: podManaged(root, p, attached)})
			}
			if g.json() {
				return writeJSON(cmd.OutOrStdout(), views)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "POD\tSTATE\tIP\tCONTAINERS\tMANAGED\tCGROUP")
			for _, v := range views {
				var names []string
				for _, k := range v.Containers {
					names = append(names, k.Name+"("+k.State+")")
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%v\t%s\n", v.Key(), v.State, v.IP, strings.Join(names, ","), v.Managed, v.Cgroup)
			}
			return w.Flush()
		},
	}
	cmd.Flags().StringVar(&socket, "cri-socket", cri.DefaultSocket, "the container runtime's CRI socket")
	return cmd
}

// podManaged: the pod's cgroup (or one above) is attached, or every
// running container's is.
func podManaged(root string, p cri.Pod, attached map[uint64]bool) bool {
	if p.Cgroup != "" && managed(root, p.Cgroup, attached) {
		return true
	}
	n := 0
	for _, k := range p.Containers {
		if k.Cgroup == "" {
			continue
		}
		if !managed(root, k.Cgroup, attached) {
			return false
		}
		n++
	}
	return n > 0
}

// managed tells whether path or a cgroup above it is attached.
func managed(root, path string, attached map[uint64]bool) bool {
	for p := path; p != "" && strings.HasPrefix(p, root); p = filepath.Dir(p) {
		if id, err := cgroups.ID(p); err == nil && attached[id] {
			return true
		}
		if p == root {
			break
		}
	}
	return false
}
