package kube

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	goslices "slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/socklane/socklane/internal/service"
)

// Config reads a kubeconfig file, or the in-cluster configuration when
// path is empty.
func Config(path string) (*rest.Config, error) {
	if path == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("reading the in-cluster Kubernetes configuration (outside a pod give --kubeconfig): %w", err)
		}
		return c, nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("reading kubeconfig %s: %w", path, err)
	}
	return c, nil
}

// Apply programs a set of services; since is the first event of the
// batch (the programming latency runs from it).
type Apply func(set *service.Set, skipped []service.Skipped, since time.Time) error

// Watch keeps apply fed with the cluster's Services and EndpointSlices
// until ctx ends. Changes that arrive together are applied together (a
// batch closes quiet milliseconds after its last event). Each apply is
// logged with its programming latency: from the first event of the batch
// to the end of the apply.
//
// nodeName is this node's name in the cluster: its Node object's zone
// label and the endpoints' nodeName decide internalTrafficPolicy: Local
// and topology hints. Without it no endpoint is local and hints are not
// used (the log says so once).
func Watch(ctx context.Context, cfg *rest.Config, nodeName string, quiet time.Duration, budget service.Budget, apply Apply, log *slog.Logger) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating the Kubernetes client: %w", err)
	}
	f := informers.NewSharedInformerFactory(cs, 0)
	svcInf := f.Core().V1().Services()
	esInf := f.Discovery().V1().EndpointSlices()
	// This node's object only: its zone label.
	nf := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
	}))
	nodeInf := nf.Core().V1().Nodes()
	var mu sync.Mutex
	var first time.Time // first event of the pending batch
	kick := make(chan struct{}, 1)
	changed := func() {
		mu.Lock()
		if first.IsZero() {
			first = time.Now()
		}
		mu.Unlock()
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	defer f.Shutdown()
	if err := startInformers(ctx, f, changed, "services and endpointslices", svcInf.Informer(), esInf.Informer()); err != nil {
		return err
	}
	if nodeName != "" {
		defer nf.Shutdown()
		if err := startInformers(ctx, nf, changed, "this node", nodeInf.Informer()); err != nil {
			return err
		}
	} else {
		log.Warn("kubernetes services without this node's name (--node-name or NODE_NAME): internalTrafficPolicy: Local services get no endpoints, topology hints are not used")
	}
	log.Info("kubernetes source synced")
	changed()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
		}
		// Let a burst of events settle into one apply.
		if !settle(ctx, kick, quiet) {
			return nil
		}
		mu.Lock()
		since := first
		first = time.Time{}
		mu.Unlock()
		svcs, err := svcInf.Lister().List(labels.Everything())
		if err != nil {
			return err
		}
		slices, err := esInf.Lister().List(labels.Everything())
		if err != nil {
			return err
		}
		node := Node{Name: nodeName}
		if nodeName != "" {
			if n, err := nodeInf.Lister().Get(nodeName); err == nil {
				node.Zone = n.Labels[corev1.LabelTopologyZone]
				node.Addrs = nodeAddrs(n)
			}
		}
		built, ignored, notes := Build(svcs, slices, node)
		for _, n := range notes {
			log.Debug("kubernetes source", "note", n)
		}
		// Each Service stands alone: one that cannot be served is
		// skipped and reported, the others apply.
		set, skipped := service.Partition(built, budget)
		for _, sk := range skipped {
			log.Warn("kubernetes service skipped", "service", sk.Service, "reason", sk.Reason)
		}
		skipped = append(skipped, ignored...)
		goslices.SortFunc(skipped, func(a, b service.Skipped) int { return cmp.Compare(a.Service, b.Service) })
		if err := apply(set, skipped, since); err != nil {
			log.Error("applying kubernetes services", "err", err)
			continue
		}
		log.Info("kubernetes services applied", "services", len(set.Services), "skipped", len(skipped), "latency", time.Since(since))
	}
}

// nodeAddrs are a Node's InternalIP and ExternalIP addresses, once each.
func nodeAddrs(n *corev1.Node) []netip.Addr {
	var out []netip.Addr
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil || ip.IsLoopback() || ip.IsUnspecified() || goslices.Contains(out, ip) {
			continue
		}
		out = append(out, ip)
	}
	return out
}
