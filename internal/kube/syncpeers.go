package kube

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// SyncPeer is another node's agent found through the API server.
type SyncPeer struct {
	Node    string // the node it runs on: the name in its certificate
	Address string // its pod address and the sync port
}

// ParsePeerSource reads NAMESPACE/SELECTOR (the agents' pods: the
// DaemonSet's namespace and its pods' labels).
func ParsePeerSource(s string) (string, labels.Selector, error) {
	ns, sel, ok := strings.Cut(s, "/")
	if !ok || ns == "" || sel == "" {
		return "", nil, fmt.Errorf("--sync-peers-from %q: want NAMESPACE/SELECTOR of the agents' pods (for example kube-system/app.kubernetes.io/name=socklane)", s)
	}
	ls, err := labels.Parse(sel)
	if err != nil {
		return "", nil, fmt.Errorf("--sync-peers-from %q: %w", s, err)
	}
	return ns, ls, nil
}

// WatchSyncPeers reports the running agents' pods (one per node) in
// namespace matching sel, with port, every time the set changes (at
// most every settle), until ctx ends; the first report comes once the
// pods are listed.
func WatchSyncPeers(ctx context.Context, cfg *rest.Config, namespace string, sel labels.Selector, port string, settle time.Duration, report func([]SyncPeer), log *slog.Logger) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating the Kubernetes client: %w", err)
	}
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel.String() }))
	inf := f.Core().V1().Pods().Informer()
	changed := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke,
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("listing the agents' pods in %s failed (RBAC: get, list and watch pods)", namespace)
	}
	log.Info("sync peers from the API server", "namespace", namespace, "selector", sel.String())
	var last []SyncPeer
	for {
		peers := syncPeers(inf.GetStore().List(), port)
		if !slices.Equal(peers, last) {
			report(peers)
			last = peers
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(settle):
		}
	}
}

// syncPeers are the running, addressed pods, one per node (the newest
// if a node has two, as during a rolling update), sorted by node.
func syncPeers(objs []any, port string) []SyncPeer {
	byNode := map[string]*corev1.Pod{}
	for _, o := range objs {
		p, ok := o.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" || p.Status.PodIP == "" || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		if cur := byNode[p.Spec.NodeName]; cur == nil || p.CreationTimestamp.After(cur.CreationTimestamp.Time) {
			byNode[p.Spec.NodeName] = p
		}
	}
	out := make([]SyncPeer, 0, len(byNode))
	for node, p := range byNode {
		out = append(out, SyncPeer{Node: node, Address: net.JoinHostPort(p.Status.PodIP, port)})
	}
	slices.SortFunc(out, func(a, b SyncPeer) int { return strings.Compare(a.Node, b.Node) })
	return out
}
