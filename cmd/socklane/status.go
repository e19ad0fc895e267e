package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/socklane/socklane/internal/cgroups"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/node"
	"github.com/spf13/cobra"
)

type statusReport struct {
	PinDir string `json:"pin_dir"`
	// What the kernel offers the datapath, and what was adapted to it.
	Kernel  datapath.Features `json:"kernel"`
	Adapted []string          `json:"adapted"`
	// Settings that follow from the kernel's bugs, and how to override.
	Decided []string `json:"decided,omitempty"`
	// The settings the running datapath was loaded with (nil: they could
	// not be read, e.g. from a datapath an older socklane loaded).
	Settings    *datapath.Settings    `json:"settings,omitempty"`
	Attachments []datapath.Attachment `json:"attachments"`
	Sockets     int                   `json:"bypassed_sockets"`
	// Of them, per socket map: with the valve's verdict, or plain.
	SocketMaps datapath.SocketCounts             `json:"socket_maps"`
	Counters   datapath.Counts[datapath.Counter] `json:"counters"`
	// Destinations whose recent connections were brief, per network
	// namespace: from SL_BRIEF_LEARN in a row, their connections stay on TCP.
	Brief []datapath.BriefDest `json:"brief_destinations"`
	// The service load balancer: its counters, the connected sockets it
	// remembers a backend for, and per service the connections (and
	// unconnected UDP sends) each backend was chosen for and the
	// no-backend refusals.
	LBCounters     datapath.Counts[datapath.LBCounter] `json:"lb_counters"`
	TrackedSockets int                                 `json:"lb_tracked_sockets"`
	Services       []serviceView                       `json:"services"`
	// What each owner (a cgroup) may hold of the node-wide tables, and
	// the owners that were refused entries beyond it.
	Quotas    datapath.Quotas  `json:"owner_quotas"`
	OverQuota []datapath.Owner `json:"owners_over_quota"`
	// Network policy: whether any is enforced, how many, the applies so
	// far, and the verdicts over all policies.
	Policy policyStatus `json:"policy"`
}

type policyStatus struct {
	Enforced bool   `json:"enforced"`
	Policies int    `json:"policies"`
	Pods     int    `json:"local_pods"`
	Applies  uint64 `json:"applies"`
	Allowed  uint64 `json:"allowed"`
	Denied   uint64 `json:"denied"`
}

func newStatusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show attachments, bypassed sockets and datapath counters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dp, err := g.openPinned()
			if err != nil {
				return err
			}
			defer dp.Close()
			rep := statusReport{PinDir: dp.PinDir(), Kernel: dp.Features(), Adapted: dp.Features().Adapted()}
			if st, err := dp.Settings(); err != nil {
				g.logger(cmd.ErrOrStderr()).Warn("the running datapath's settings cannot be read", "err", err)
			} else {
				rep.Settings = &st
				rep.Decided = dp.Features().Decided(st)
				rep.Quotas = st.Quotas()
			}
			if rep.Attachments, err = dp.Attachments(); err != nil {
				return err
			}
			if root, err := cgroups.Root(); err == nil {
				names := cgroupNames(root)
				for i := range rep.Attachments {
					rep.Attachments[i].Path = names[rep.Attachments[i].CgroupID]
				}
			}
			if rep.SocketMaps, err = dp.SocketsByMap(); err != nil {
				return err
			}
			rep.Sockets = rep.SocketMaps.Total()
			if rep.Counters, err = dp.Counters(); err != nil {
				return err
			}
			if rep.Brief, err = dp.BriefDests(); err != nil {
				return err
			}
			var lb *datapath.LBStats
			if rep.Services, lb, err = serviceViews(dp, g.name, ""); err != nil {
				return err
			}
			rep.LBCounters = lb.Counters
			if rep.TrackedSockets, err = dp.TrackedSockets(); err != nil {
				return err
			}
			owners, err := dp.Owners()
			if err != nil {
				return err
			}
			rep.OverQuota = []datapath.Owner{}
			root, _ := cgroups.Root()
			for _, o := range owners {
				if o.Refused() {
					if root != "" {
						o.Path, _ = cgroups.PathOf(root, o.Cgroup)
					}
					rep.OverQuota = append(rep.OverQuota, o)
				}
			}
			if rep.Policy, err = readPolicyStatus(dp, g.name); err != nil {
				return err
			}
			if g.json() {
				return writeJSON(cmd.OutOrStdout(), rep)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "datapath\t%s\n", rep.PinDir)
			fmt.Fprintf(w, "kernel\t%s\tkptr_untrusted %v\tsk_psock.msg_tot_len %v\n", rep.Kernel.Kernel, rep.Kernel.KptrUntrusted, rep.Kernel.PsockMsgTotLen)
			for _, a := range rep.Adapted {
				fmt.Fprintf(w, "adapted\t%s\n", a)
			}
			for _, b := range rep.Kernel.Bugs {
				fmt.Fprintf(w, "kernel bug\t%s\t%s\tfix: %s\n", b.Name, b.Effect, b.Fix)
			}
			if rep.Kernel.BugsError != "" {
				fmt.Fprintf(w, "kernel bugs\tnot probed: %s\n", rep.Kernel.BugsError)
			}
			if rep.Settings != nil {
				for _, f := range rep.Settings.Flags() {
					fmt.Fprintf(w, "setting\t--%s %s\n", f.Name, f)
				}
				for _, d := range rep.Decided {
					fmt.Fprintf(w, "decided\t%s\n", d)
				}
			}
			fmt.Fprintf(w, "bypassed sockets\t%d\twith the valve's verdict %d\tplain %d\tgiven the verdict late %d\n", rep.Sockets, rep.SocketMaps.Valve, rep.SocketMaps.Plain, rep.SocketMaps.Late)
			for _, a := range rep.Attachments {
				fmt.Fprintf(w, "attached\t%s\tcgroup id %d\tlink %d\n", a.Path, a.CgroupID, a.LinkID)
			}
			counters := rep.Counters.Map()
			for _, k := range slices.Sorted(maps.Keys(counters)) {
				fmt.Fprintf(w, "%s\t%d\n", k, counters[k])
			}
			for _, b := range rep.Brief {
				fmt.Fprintf(w, "brief destination\t%s\tnetns %d\tin a row %d\tskipped %d\tprobe 1 in %d\n", b.Dest, b.NetNS, b.InARow, b.Skipped, b.ProbeEvery)
			}
			fmt.Fprintf(w, "lb tracked sockets\t%d\n", rep.TrackedSockets)
			lbCounters := rep.LBCounters.Map()
			for _, k := range slices.Sorted(maps.Keys(lbCounters)) {
				fmt.Fprintf(w, "lb %s\t%d\n", k, lbCounters[k])
			}
			for _, v := range rep.Services {
				bes := make([]string, 0, len(v.Selected))
				for be, n := range v.Selected {
					bes = append(bes, fmt.Sprintf("%s=%d", be, n))
				}
				slices.Sort(bes)
				fmt.Fprintf(w, "service %s\tselected %s\trefused %d\n", v.Key(), strings.Join(bes, " "), v.Refused)
			}
			fmt.Fprintf(w, "network policy\tenforced %v\t%d policies\t%d local pods\t%d applies\tallowed %d\tdenied %d\n",
				rep.Policy.Enforced, rep.Policy.Policies, rep.Policy.Pods, rep.Policy.Applies, rep.Policy.Allowed, rep.Policy.Denied)
			for _, o := range rep.OverQuota {
				fmt.Fprintf(w, "over quota	%s	cgroup id %d	refused conns %d (holds %d of %d)	listeners %d (%d of %d)	lb conns %d (%d of %d)	affinity %d (%d of %d)	udp tables %d (%d of %d)	evict timers %d (%d of %d)	messages %d (%d of %d)\n",
					o.Path, o.Cgroup, o.RefusedConns, o.Conns, rep.Quotas.Conns, o.RefusedListeners, o.Listeners, rep.Quotas.Listeners,
					o.RefusedLBConns, o.LBConns, rep.Quotas.LBConns, o.RefusedAffinity, o.Affinity, rep.Quotas.Affinity,
					o.RefusedUDPTables, o.UDPTables, rep.Quotas.UDPTables, o.RefusedEvictTimers, o.EvictTimers, rep.Quotas.EvictTimers,
					o.RefusedMsgs, o.Msgs, rep.Quotas.Msgs)
			}
			return w.Flush()
		},
	}
}

// cgroupNames maps cgroup ids to paths by walking the hierarchy.
func cgroupNames(root string) map[uint64]string {
	out := map[uint64]string{}
	var walk func(dir string, depth int)
	walk = func(dir string, depth int) {
		if id, err := cgroups.ID(dir); err == nil {
			out[id] = dir
		}
		if depth > 16 {
			return
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		for _, e := range entries {
			if e.IsDir() {
				walk(filepath.Join(dir, e.Name()), depth+1)
			}
		}
	}
	walk(root, 0)
	return out
}

// readPolicyStatus sums what the datapath holds of network policy.
func readPolicyStatus(dp *datapath.Datapath, name string) (policyStatus, error) {
	var ps policyStatus
	_, on, gen, err := dp.PolicyLive()
	if err != nil {
		return ps, err
	}
	ps.Enforced, ps.Applies = on, gen
	counts, err := dp.PolicyCounts()
	if err != nil {
		return ps, err
	}
	for _, c := range counts {
		ps.Allowed += c.Allowed
		ps.Denied += c.Denied
	}
	set, _, err := node.AppliedPolicies(name)
	if err != nil || set == nil {
		return ps, err
	}
	ps.Policies = len(set.Policies)
	for _, p := range set.Pods {
		if p.Local() {
			ps.Pods++
		}
	}
	return ps, nil
}
