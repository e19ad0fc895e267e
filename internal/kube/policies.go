package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/socklane/socklane/internal/policy"
)

// LocalCgroups maps the UIDs of this node's running pods to their cgroup
// v2 directories (from the container runtime).
type LocalCgroups func() map[string]string

// BuildPolicies turns the cluster's NetworkPolicies, Namespaces and Pods
// into the policy model; the pods of node get their cgroups from local.
// Pods without an address yet, and finished ones, are left out. It
// returns what it had to leave out, for the log.
func BuildPolicies(nps []*networkingv1.NetworkPolicy, nss []*corev1.Namespace, pods []*corev1.Pod, node string, local map[string]string) (*policy.Set, []string) {
	set := &policy.Set{}
	var notes []string
	for _, ns := range nss {
		set.Namespaces = append(set.Namespaces, policy.Namespace{Name: ns.Name, Labels: ns.Labels})
	}
	for _, p := range pods {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || len(p.Status.PodIPs) == 0 {
			continue
		}
		mp := &policy.Pod{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels}
		for _, ip := range p.Status.PodIPs {
			if a, err := netip.ParseAddr(ip.IP); err == nil {
				mp.IPs = append(mp.IPs, a.Unmap())
			}
		}
		for _, c := range p.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == "" {
					continue
				}
				proto, err := policy.ParseProtocol(string(cp.Protocol))
				if err != nil {
					continue // SCTP: not enforced
				}
				mp.Ports = append(mp.Ports, policy.NamedPort{Name: cp.Name, Port: uint16(cp.ContainerPort), Protocol: proto})
			}
		}
		if p.Spec.NodeName == node {
			mp.Cgroup = local[string(p.UID)]
			if mp.Cgroup == "" {
				notes = append(notes, fmt.Sprintf("pod %s/%s: not running in this node's runtime yet", p.Namespace, p.Name))
			}
		}
		set.Pods = append(set.Pods, mp)
	}
	for _, np := range nps {
		pol, errs := policy.FromK8s(np)
		if len(errs) > 0 {
			notes = append(notes, fmt.Sprintf("policy %s/%s not enforced: %v", np.Namespace, np.Name, errs))
			continue
		}
		set.Policies = append(set.Policies, pol)
	}
	return set, notes
}

// RemotePods are the other nodes' pods from elsewhere than the API server
// (the state sync's pod table), where this node publishes its own.
type RemotePods interface {
	// Publish says this node's pods to the other nodes.
	Publish(local []*policy.Pod) error
	// Pods are the other nodes' pods.
	Pods() ([]*policy.Pod, error)
	// Changed is signalled when Pods may say something new.
	Changed() <-chan struct{}
	// Ready is closed once Pods holds what the other nodes published
	// (or the wait for it gave up); Changed is signalled then too.
	Ready() <-chan struct{}
	// Prune deletes the pods of nodes the cluster stopped listing (live
	// says whether it lists one; nodes: how many) and says whether it
	// deleted any.
	Prune(live func(node string) bool, nodes int) (bool, error)
}

// pruneInterval is how often the nodes the cluster lists are compared
// with the nodes that have pods in the remote table.
const pruneInterval = 10 * time.Second

// WatchPolicies keeps apply fed with the cluster's network policies until
// ctx ends: NetworkPolicies, Namespaces and Pods through informers, this
// node's pods' cgroups through local (checked every second: a pod that
// starts on this node is enforced once the runtime runs it). With remote,
// only this node's pods are watched; the other nodes' come from remote,
// which is told this node's. Changes that arrive together are applied
// together.
func WatchPolicies(ctx context.Context, cfg *rest.Config, node string, quiet time.Duration, local LocalCgroups, remote RemotePods, apply func(*policy.Set) error, log *slog.Logger) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating the Kubernetes client: %w", err)
	}
	f := informers.NewSharedInformerFactory(cs, 0)
	npInf := f.Networking().V1().NetworkPolicies()
	nsInf := f.Core().V1().Namespaces()
	podFactory, what := f, "networkpolicies, namespaces and pods"
	var remoteChanged <-chan struct{}
	var prune <-chan time.Time
	var nodes func() (map[string]bool, error)
	if remote != nil {
		podFactory = informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
		}))
		defer podFactory.Shutdown()
		what, remoteChanged = "networkpolicies, namespaces and this node's pods", remote.Changed()
		// Nodes only say which nodes' pods to keep: their names, read
		// every pruneInterval (their status updates rebuild nothing).
		var stop func()
		if nodes, stop, err = nodeNames(ctx, cfg); err != nil {
			return err
		}
		defer stop()
		t := time.NewTicker(pruneInterval)
		defer t.Stop()
		prune = t.C
	}
	podInf := podFactory.Core().V1().Pods()
	kick := make(chan struct{}, 1)
	changed := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	defer f.Shutdown()
	if remote != nil {
		if err := startInformers(ctx, podFactory, changed, what, podInf.Informer()); err != nil {
			return err
		}
	}
	infs := []cache.SharedIndexInformer{npInf.Informer(), nsInf.Informer()}
	if remote == nil {
		infs = append(infs, podInf.Informer())
	}
	if err := startInformers(ctx, f, changed, what, infs...); err != nil {
		return err
	}
	log.Info("kubernetes policy source synced", "pods", map[bool]string{true: "this node's, the others' through the sync", false: "every node's"}[remote != nil])
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var lastLocal map[string]string
	changed()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if !maps.Equal(local(), lastLocal) {
				changed()
			}
			continue
		case <-remoteChanged:
			changed()
			continue
		case <-prune:
			if pruneRemote(nodes, remote, log) {
				changed()
			}
			continue
		case <-kick:
		}
		if remote != nil && !isClosed(remote.Ready()) {
			// Policies built without the other nodes' pods would deny
			// what they allow to any of them until the sync catches up:
			// what the datapath enforces now stays until then.
			continue
		}
		if !settle(ctx, kick, quiet) {
			return nil
		}
		nps, err := npInf.Lister().List(labels.Everything())
		if err != nil {
			return err
		}
		nss, err := nsInf.Lister().List(labels.Everything())
		if err != nil {
			return err
		}
		pods, err := podInf.Lister().List(labels.Everything())
		if err != nil {
			return err
		}
		lastLocal = local()
		start := time.Now()
		set, notes := BuildPolicies(nps, nss, pods, node, lastLocal)
		remotes := 0
		if remote != nil {
			if remotes, err = withRemote(set, remote); err != nil {
				log.Error("the other nodes' pods", "err", err)
			}
		}
		for _, n := range notes {
			log.Debug("kubernetes policy source", "note", n)
		}
		if err := apply(set); err != nil {
			log.Error("applying kubernetes network policies", "err", err)
			continue
		}
		log.Info("kubernetes network policies applied", "policies", len(set.Policies), "pods", len(set.Pods), "other_nodes_pods", remotes, "latency", time.Since(start))
	}
}

// pruneRemote has remote delete the pods of nodes the cluster no longer
// lists, and says whether it deleted any.
func pruneRemote(nodes func() (map[string]bool, error), remote RemotePods, log *slog.Logger) bool {
	live, err := nodes()
	if err != nil {
		log.Error("listing the cluster's nodes", "err", err)
		return false
	}
	deleted, err := remote.Prune(func(n string) bool { return live[n] }, len(live))
	if err != nil {
		log.Error("deleting the pods of nodes the cluster no longer lists", "err", err)
	}
	return deleted
}

// withRemote publishes set's pods (this node's) and adds the other nodes'
// from remote, but for an address or a name one of this node's pods has
// (a record not yet replaced or deleted after the pod or its address moved
// here), and a second record of one pod. It returns how many pods it
// added.
func withRemote(set *policy.Set, remote RemotePods) (int, error) {
	pubErr := remote.Publish(set.Pods)
	others, err := remote.Pods()
	if err != nil {
		return 0, errors.Join(pubErr, err)
	}
	mine, names := map[netip.Addr]bool{}, map[string]bool{}
	for _, p := range set.Pods {
		names[p.Key()] = true
		for _, a := range p.IPs {
			mine[a] = true
		}
	}
	n := 0
	for _, p := range others {
		p.IPs = slices.DeleteFunc(p.IPs, func(a netip.Addr) bool { return mine[a] })
		if len(p.IPs) == 0 || names[p.Key()] {
			continue
		}
		names[p.Key()] = true
		set.Pods = append(set.Pods, p)
		n++
	}
	return n, pubErr
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
