package agent

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/socklane/socklane/internal/cgroups"
	"github.com/socklane/socklane/internal/cri"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/kube"
	"github.com/socklane/socklane/internal/node"
)

// DefaultPodInterval is how often the agent lists the runtime's pods for
// its standing selector.
const DefaultPodInterval = 2 * time.Second

// DefaultSweepInterval is how often the agent reclaims what sockets of
// detached cgroups left behind.
const DefaultSweepInterval = 30 * time.Second

// podWatch keeps the datapath attached to exactly the running pods that
// match a label selector.
type podWatch struct {
	c   *cri.Client
	sel cri.Selector
	// fromAPI, if set, selects instead: the pods the API server places on
	// this node with matching labels, found in the runtime by UID.
	fromAPI  *kube.PodSet
	dp       *datapath.Datapath
	log      *slog.Logger
	attached map[uint64]string // cgroup id -> pod, attached by this agent
	// cgroups are the attached pods' cgroup directories by pod UID (the
	// policy source's local pods), read by another goroutine.
	mu      sync.Mutex
	cgroups map[string]string
	// optouts are the labels that opt attached pods out of part of the
	// datapath, each with the pods it opted out.
	optouts []*optOut
}

// Cgroups returns the attached pods' cgroup directories by pod UID.
func (w *podWatch) Cgroups() map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.cgroups)
}

// reconcile attaches pods that match and appeared, and removes the
// attachments of pods that went away (their cgroups are gone).
func (w *podWatch) reconcile(ctx context.Context) {
	pods, err := w.c.Pods(ctx)
	if err != nil {
		w.log.Error("listing pods", "err", err)
		return
	}
	root, err := cgroups.Root()
	if err != nil {
		w.log.Error("finding the cgroup v2 root", "err", err)
		return
	}
	want := map[uint64]bool{}
	byUID := map[string]string{}
	defer func() {
		w.mu.Lock()
		w.cgroups = byUID
		w.mu.Unlock()
	}()
	for _, p := range w.selected(pods) {
		if p.Cgroup == "" {
			continue
		}
		path, id, err := cgroups.Resolve(root, p.Cgroup)
		if err != nil {
			continue // went away meanwhile
		}
		want[id] = true
		if _, ok := w.attached[id]; ok {
			byUID[p.UID] = path
			continue
		}
		if _, err := w.dp.Attach(path, id); err != nil {
			w.log.Error("attaching pod", "pod", p.Key(), "cgroup", path, "err", err)
			continue
		}
		byUID[p.UID] = path
		w.attached[id] = p.Key()
		w.log.Info("pod attached", "pod", p.Key(), "cgroup", path, "cgroup_id", id)
	}
	w.syncOptOut(w.selected(pods))
	// Pods this agent attached that stopped or were removed.
	detached := 0
	for id, pod := range w.attached {
		if want[id] {
			continue
		}
		if _, err := w.dp.Detach(id); err != nil {
			w.log.Error("detaching pod", "pod", pod, "cgroup_id", id, "err", err)
			continue
		}
		w.log.Info("pod gone: detached", "pod", pod, "cgroup_id", id)
		delete(w.attached, id)
		detached++
	}
	// Attachments whose cgroup the kernel already released (attached by
	// an earlier agent, or by hand).
	gone, err := datapath.Pins(w.dp.PinDir()).PruneDefunct()
	if err != nil {
		w.log.Error("removing attachments of gone cgroups", "err", err)
	}
	for _, id := range gone {
		w.log.Info("cgroup gone: attachment removed", "cgroup_id", id)
	}
	if detached > 0 || len(gone) > 0 {
		// Sockets that outlive their cgroup's attachment close unseen.
		node.Reclaim(w.dp, w.log)
	}
}

// selected are the running pods to attach.
func (w *podWatch) selected(pods []cri.Pod) []cri.Pod {
	if w.fromAPI == nil {
		return cri.Select(pods, w.sel)
	}
	uids := w.fromAPI.UIDs()
	var out []cri.Pod
	for _, p := range pods {
		if _, ok := uids[p.UID]; ok && p.Ready() {
			out = append(out, p)
		}
	}
	return out
}

// optOut is an opt-out whose label the agent applies, with the pods it
// opted out.
type optOut struct {
	node.OptOut
	pods map[string]uint64 // pod UID -> network namespace cookie
}

func newOptOuts() []*optOut {
	var out []*optOut
	for _, o := range node.OptOuts() {
		out = append(out, &optOut{OptOut: o, pods: map[string]uint64{}})
	}
	return out
}

// syncOptOut opts the selected pods labelled OptOutLabel=off out of
// connect-time service balancing and those labelled BypassOptOutLabel=off
// out of the bypass (by their sandbox's network namespace), and forgets
// the namespaces of pods gone or relabelled.
func (w *podWatch) syncOptOut(pods []cri.Pod) {
	if w.optouts == nil {
		w.optouts = newOptOuts()
	}
	for _, o := range w.optouts {
		w.syncLabel(o, pods)
	}
}

func (w *podWatch) syncLabel(o *optOut, pods []cri.Pod) {
	seen := map[string]bool{}
	for _, p := range pods {
		if p.Labels[o.Label] != "off" || p.PID <= 0 {
			continue
		}
		seen[p.UID] = true
		if _, done := o.pods[p.UID]; done {
			continue
		}
		c, err := o.Apply(w.dp, fmt.Sprintf("/proc/%d/ns/net", p.PID), true)
		if err != nil {
			w.log.Error("opting a pod out of "+o.What, "pod", p.Key(), "err", err)
			continue
		}
		o.pods[p.UID] = c
		w.log.Info("pod opted out of "+o.What, "pod", p.Key(), "label", o.Label+"=off", "netns_cookie", c)
	}
	for uid, c := range o.pods {
		if seen[uid] {
			continue
		}
		if err := o.Set(w.dp, c, false); err != nil {
			w.log.Error("forgetting a gone pod's opt-out of "+o.What, "netns_cookie", c, "err", err)
			continue
		}
		delete(o.pods, uid)
	}
}
