package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/socklane/socklane/internal/cri"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/ports"
	"github.com/spf13/cobra"
)

func newPortsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ports",
		Short: "Port virtualization: copies of a program binding one port, side by side (apply a YAML file, list)",
	}
	var criSocket string
	apply := newApplyCmd(g, "ports", "Make the port virtualization hold exactly the workloads and routes in FILE (validated in full first)", ports.ParseFile,
		func(cmd *cobra.Command, dp *datapath.Datapath, set *ports.Set) error {
			r, err := node.ApplyPorts(cmd.Context(), dp, g.name, set, criSocket)
			if err != nil {
				return err
			}
			if g.json() {
				return writeJSON(cmd.OutOrStdout(), r)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "applied %d workloads (%d virtual ports, %d cgroups; hooks on %d cgroups) in %s\n",
				r.Workloads, r.VirtualPorts, r.Cgroups, r.Hooked, r.Took.Round(100*time.Microsecond))
			return nil
		})
	apply.Flags().StringVar(&criSocket, "cri-socket", cri.DefaultSocket, "the container runtime's CRI socket (for pod and selector workloads)")
	list := &cobra.Command{
		Use:   "list",
		Short: "List the real ports handed out: workload, virtual, real, sockets, age",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return listPorts(cmd, g)
		},
	}
	var domain string
	hosts := &cobra.Command{
		Use:   "hosts",
		Short: "Print the applied workloads' addresses as /etc/hosts lines (NAME, or NAME.DOMAIN)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rec, err := node.AppliedPorts(g.name)
			if err != nil {
				return err
			}
			for _, w := range rec.Set.Workloads {
				name := w.Name
				if domain != "" {
					name += "." + strings.TrimPrefix(domain, ".")
				}
				for _, a := range w.Addresses {
					fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\n", a, name)
				}
			}
			return nil
		},
	}
	hosts.Flags().StringVar(&domain, "domain", "", "domain appended to each workload's name")
	cmd.AddCommand(apply, list, hosts)
	return cmd
}

// portView is a claimed real port with its workload's name.
type portView struct {
	Name string `json:"workload"`
	datapath.PortClaim
}

func listPorts(cmd *cobra.Command, g *globals) error {
	dp, err := g.openPinned()
	if err != nil {
		return err
	}
	defer dp.Close()
	rec, err := node.AppliedPorts(g.name)
	if err != nil {
		return err
	}
	claims, err := dp.PortClaims()
	if err != nil {
		return err
	}
	stats, err := dp.PortStats()
	if err != nil {
		return err
	}
	names := rec.WorkloadNames()
	views := []portView{}
	for _, c := range claims {
		n := names[c.Workload]
		if c.Workload == 0 {
			n = "-"
		}
		views = append(views, portView{Name: n, PortClaim: c})
	}
	if g.json() {
		counters := map[string]map[string]uint64{}
		for id, m := range stats {
			if n, ok := names[id]; ok {
				counters[n] = m
			}
		}
		return writeJSON(cmd.OutOrStdout(), map[string]any{"ports": views, "counters": counters, "rules": rec.Set})
	}
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKLOAD\tPROTO\tVIRTUAL\tREAL\tSOCKETS\tSOCKET\tSTATE\tAGE")
	for _, v := range views {
		state := "bound"
		switch {
		case v.Resting:
			state = "resting"
		case v.Direct:
			state = "direct"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", v.Name, v.Proto, v.Virtual, v.Real, v.Sockets, v.Cookie, state, v.Age.Round(time.Second))
	}
	return tw.Flush()
}
