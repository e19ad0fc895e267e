package main

import (
	"fmt"
	"net/netip"
	"strings"
	"text/tabwriter"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/service"
	"github.com/spf13/cobra"
)

func newSvcCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "svc",
		Short: "Services balanced at connect(): apply a YAML file, list, get",
	}
	apply := newApplyCmd(g, "service", "Make the load balancer serve exactly the services in FILE (validated in full first)", service.ParseFile,
		func(cmd *cobra.Command, dp *datapath.Datapath, set *service.Set) error {
			st, err := node.ApplyServices(dp, g.name, set, nil)
			if err != nil {
				return err
			}
			if g.json() {
				return writeJSON(cmd.OutOrStdout(), map[string]any{
					"services": len(set.Services), "frontends": st.Frontends, "added": st.Added,
					"updated": st.Updated, "removed": st.Removed, "stale_backends": st.Stale,
					"sockets_destroyed": st.Destroyed, "took_ms": st.Took.Seconds() * 1000})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "applied %d services (%d frontends: %d added, %d updated, %d removed) in %s\n",
				len(set.Services), st.Frontends, st.Added, st.Updated, st.Removed, st.Took.Round(100_000))
			if st.Stale > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "%d backends left their services; %d of their connected sockets destroyed\n", st.Stale, st.Destroyed)
			}
			return nil
		})

	list := &cobra.Command{
		Use:   "list",
		Short: "List the applied services with backends and selection counts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return showServices(cmd, g, "")
		},
	}
	get := &cobra.Command{
		Use:   "get [NAMESPACE/]NAME",
		Short: "Show one applied service",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return showServices(cmd, g, args[0])
		},
	}
	cmd.AddCommand(apply, list, get, newSvcOptOutCmd(g))
	return cmd
}

// serviceView is a service with what the datapath counted for it.
type serviceView struct {
	*service.Service
	Selected map[string]uint64 `json:"selected"` // backend ip:port -> connections and sends
	Refused  uint64            `json:"refused"`
}

// serviceViews joins the applied services (all, or only one) with the
// load balancer's counters.
func serviceViews(dp *datapath.Datapath, name, only string) ([]serviceView, *datapath.LBStats, error) {
	svcs, err := node.AppliedServices(name)
	if err != nil {
		return nil, nil, err
	}
	st, err := dp.ServiceStats()
	if err != nil {
		return nil, nil, err
	}
	views := []serviceView{}
	for _, s := range svcs {
		if only != "" && s.Key() != only && "default/"+only != s.Key() {
			continue
		}
		v := serviceView{Service: s, Selected: map[string]uint64{}}
		fronts := map[service.Frontend]bool{}
		for _, f := range s.Frontends() {
			fronts[f] = true
			v.Refused += st.Refused[f.String()]
		}
		for _, sel := range st.Selections {
			if fronts[sel.Frontend] {
				v.Selected[sel.Backend.String()] += sel.Count
			}
		}
		views = append(views, v)
	}
	return views, st, nil
}

func showServices(cmd *cobra.Command, g *globals, only string) error {
	dp, err := g.openPinned()
	if err != nil {
		return err
	}
	defer dp.Close()
	views, st, err := serviceViews(dp, g.name, only)
	if err != nil {
		return err
	}
	if only != "" && len(views) == 0 {
		return fmt.Errorf("service %s is not applied (see `socklane svc list`)", only)
	}
	skipped, err := node.SkippedServices(g.name)
	if err != nil {
		return err
	}
	if only != "" {
		skipped = nil
	}
	if g.json() {
		return writeJSON(cmd.OutOrStdout(), map[string]any{"services": views, "counters": st.Counters, "skipped": skipped})
	}
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tVIPS\tPORTS\tBACKENDS (selected)\tAFFINITY\tREFUSED")
	for _, v := range views {
		var vips, ports, bes []string
		for _, a := range v.VIPs {
			vips = append(vips, a.String())
		}
		for _, a := range v.ExternalIPs {
			vips = append(vips, a.String()+"(external)")
		}
		for _, p := range v.Ports {
			node := ""
			if p.NodePort != 0 && len(v.NodeAddrs) > 0 {
				node = fmt.Sprintf(",node:%d", p.NodePort)
			}
			ports = append(ports, fmt.Sprintf("%d->%d/%s%s", p.Port, p.TargetPort, p.Protocol, node))
		}
		for _, b := range v.Backends {
			n := uint64(0)
			for _, p := range v.Ports {
				n += v.Selected[netip.AddrPortFrom(b.IP, p.TargetPort).String()]
			}
			state := ""
			switch {
			case b.Excluded != "":
				state = ",elsewhere"
			case b.Terminating:
				state = ",terminating"
			case !b.IsReady():
				state = ",not-ready"
			}
			bes = append(bes, fmt.Sprintf("%s(%d%s)", b.IP, n, state))
		}
		aff := string(v.Affinity)
		if v.Affinity == service.AffinityClientIP {
			aff += "/" + v.Timeout.String()
		}
		if v.Selection == service.SelectMaglev {
			aff += ",maglev"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", v.Key(), strings.Join(vips, ","), strings.Join(ports, ","), strings.Join(bes, " "), aff, v.Refused)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, v := range views {
		if v.Choice != "" {
			fmt.Fprintf(cmd.OutOrStdout(), "%s: new connections go to %s\n", v.Key(), v.Choice)
		}
	}
	for _, ignored := range []bool{false, true} {
		var lines []string
		for _, sk := range skipped {
			if sk.Ignored == ignored {
				lines = append(lines, fmt.Sprintf("  %s: %s\n", sk.Service, sk.Reason))
			}
		}
		switch {
		case len(lines) == 0:
			continue
		case ignored:
			fmt.Fprintf(cmd.OutOrStdout(), "\n%d services left to others (not served by design):\n", len(lines))
		default:
			fmt.Fprintf(cmd.OutOrStdout(), "\n%d services skipped (not served):\n", len(lines))
		}
		fmt.Fprint(cmd.OutOrStdout(), strings.Join(lines, ""))
	}
	return nil
}
