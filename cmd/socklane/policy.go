package main

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/policy"
	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

func newPolicyCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Kubernetes NetworkPolicy at the socket: apply a YAML file, list, get, test a flow",
	}
	apply := newApplyCmd(g, "policy", "Enforce exactly the policies in FILE, with the namespaces and pods it describes (validated in full first)", policy.ParseFile,
		func(cmd *cobra.Command, dp *datapath.Datapath, set *policy.Set) error {
			res, err := node.ApplyPolicies(dp, g.name, set, g.logger(cmd.ErrOrStderr()))
			if err != nil {
				return err
			}
			if g.json() {
				return writeJSON(cmd.OutOrStdout(), res)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "applied %d policies (%d addresses, %d local pods, %d rules; compiled in %s, written in %s); %d established connections destroyed\n",
				res.Policies, res.Addresses, res.Cgroups, res.Rules, res.Compile.Round(10_000), res.Took.Round(10_000), res.Destroyed)
			return nil
		})
	list := &cobra.Command{
		Use:   "list",
		Short: "List the applied policies with the pods they isolate and their verdict counts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return showPolicies(cmd, g, "")
		},
	}
	get := &cobra.Command{
		Use:   "get [NAMESPACE/]NAME",
		Short: "Show one applied policy as YAML with its counts",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return showPolicies(cmd, g, args[0])
		},
	}
	var from, to string
	test := &cobra.Command{
		Use:   "test --from NS/POD|IP --to NS/POD:PORT/PROTO|IP:PORT/PROTO",
		Short: "Judge a new flow by the applied policies: the verdict and the rule that decided it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			set, _, err := node.AppliedPolicies(g.name)
			if err != nil {
				return err
			}
			if set == nil {
				set = &policy.Set{}
			}
			src, err := policyEndpoint(set, from, "--from")
			if err != nil {
				return err
			}
			dstSpec, portSpec, ok := strings.Cut(to, ":")
			if i := strings.LastIndex(to, ":"); i >= 0 && strings.Count(to, ":") > 1 {
				dstSpec, portSpec, ok = to[:i], to[i+1:], true // IPv6
			}
			if !ok {
				return fmt.Errorf("--to %q: want NS/POD:PORT/PROTO or IP:PORT/PROTO", to)
			}
			dst, err := policyEndpoint(set, strings.Trim(dstSpec, "[]"), "--to")
			if err != nil {
				return err
			}
			portStr, protoStr, _ := strings.Cut(portSpec, "/")
			port, err := strconv.ParseUint(portStr, 10, 16)
			if err != nil || port == 0 {
				return fmt.Errorf("--to %q: port %q: want 1-65535", to, portStr)
			}
			proto, err := policy.ParseProtocol(protoStr)
			if err != nil {
				return fmt.Errorf("--to %q: %w", to, err)
			}
			v := set.Decide(src, dst, uint16(port), proto)
			if g.json() {
				return writeJSON(cmd.OutOrStdout(), map[string]any{"allowed": v.Allowed, "direction": v.Dir.String(),
					"policy": v.Policy, "rule": v.Rule, "reason": v.Reason})
			}
			fmt.Fprintln(cmd.OutOrStdout(), v)
			return nil
		},
	}
	test.Flags().StringVar(&from, "from", "", "the client: NAMESPACE/POD or an IP address")
	test.Flags().StringVar(&to, "to", "", "the server: NAMESPACE/POD:PORT/PROTO or IP:PORT/PROTO")
	cmd.AddCommand(apply, list, get, test)
	return cmd
}

// policyEndpoint reads NS/POD or an address.
func policyEndpoint(set *policy.Set, spec, flag string) (policy.Endpoint, error) {
	if spec == "" {
		return policy.Endpoint{}, fmt.Errorf("%s is required", flag)
	}
	if a, err := netip.ParseAddr(spec); err == nil {
		return set.Endpoint(a.Unmap()), nil
	}
	p := set.Pod(spec)
	if p == nil {
		return policy.Endpoint{}, fmt.Errorf("%s %q: no applied pod of that name and not an IP address (see `socklane policy list`)", flag, spec)
	}
	e := policy.Endpoint{Pod: p}
	if len(p.IPs) > 0 {
		e.Addr = p.IPs[0]
	}
	return e, nil
}

// policyView is an applied policy with what the datapath counted for it.
type policyView struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	ID        uint32   `json:"id"`
	Types     []string `json:"policy_types"`
	Selects   []string `json:"selects"`
	datapath.PolicyCount
}

func showPolicies(cmd *cobra.Command, g *globals, only string) error {
	set, ids, err := node.AppliedPolicies(g.name)
	if err != nil {
		return err
	}
	if set == nil {
		set = &policy.Set{}
	}
	dp, err := g.openPinned()
	if err != nil {
		return err
	}
	defer dp.Close()
	counts, err := dp.PolicyCounts()
	if err != nil {
		return err
	}
	var views []policyView
	for _, p := range set.Policies {
		if only != "" && p.Key() != only && "default/"+only != p.Key() {
			continue
		}
		v := policyView{Namespace: p.Namespace, Name: p.Name, ID: ids[p.Key()], Selects: []string{}, PolicyCount: counts[ids[p.Key()]]}
		for d, on := range p.Isolates {
			if on {
				v.Types = append(v.Types, policy.Direction(d).String())
			}
		}
		for _, pod := range set.Pods {
			if p.Selects(pod) {
				v.Selects = append(v.Selects, pod.Key())
			}
		}
		if only != "" {
			if g.json() {
				return writeJSON(cmd.OutOrStdout(), map[string]any{"policy": p.Source, "counts": v})
			}
			b, err := yaml.Marshal(p.Source)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s# id %d: %d allowed, %d denied; isolates %s\n", b, v.ID, v.Allowed, v.Denied, strings.Join(v.Selects, " "))
			return nil
		}
		views = append(views, v)
	}
	if only != "" {
		return fmt.Errorf("policy %s is not applied (see `socklane policy list`)", only)
	}
	sort.Slice(views, func(i, j int) bool {
		return views[i].Namespace+"/"+views[i].Name < views[j].Namespace+"/"+views[j].Name
	})
	if g.json() {
		return writeJSON(cmd.OutOrStdout(), map[string]any{"policies": views, "pods": len(set.Pods)})
	}
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POLICY\tID\tTYPES\tSELECTS\tALLOWED\tDENIED")
	for _, v := range views {
		fmt.Fprintf(tw, "%s/%s\t%d\t%s\t%d pods\t%d\t%d\n", v.Namespace, v.Name, v.ID, strings.Join(v.Types, ","), len(v.Selects), v.Allowed, v.Denied)
	}
	return tw.Flush()
}
