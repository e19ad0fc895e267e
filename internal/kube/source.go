package kube

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	goslices "slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
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

// ServiceChanges are the services whose outcome (served, skipped, gone)
// changed in one batch of events, and the whole answer, for an apply
// that cannot take the change alone.
type ServiceChanges struct {
	Changes []service.Outcome
	Whole   func() (*service.Set, []service.Skipped)
}

// Apply programs a batch of changes; since is the first event of the
// batch (the programming latency runs from it).
type Apply func(ch ServiceChanges, since time.Time) error

// Watch keeps apply fed with the cluster's Services and EndpointSlices
// until ctx ends, at the cost of what changed: each batch builds and
// judges only the Services its events touched (serviceState). Changes
// that arrive together are applied together (a batch closes quiet
// milliseconds after its last event). Each apply is logged with its
// programming latency: from the first event of the batch to the end of
// the apply. An apply that fails is tried again (the applier then takes
// the whole set), after 1 s, doubling to 30 s.
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
	if err := esInf.Informer().AddIndexers(cache.Indexers{byService: indexByService}); err != nil {
		return fmt.Errorf("indexing endpointslices: %w", err)
	}
	// This node's object only: its zone label.
	nf := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
	}))
	nodeInf := nf.Core().V1().Nodes()
	st := newServiceState(svcInf.Lister(), esInf.Informer().GetIndexer(), budget)
	defer f.Shutdown()
	if err := watchInformers(ctx, f, "services and endpointslices", map[cache.SharedIndexInformer]cache.ResourceEventHandler{
		svcInf.Informer(): st.serviceHandler(), esInf.Informer(): st.sliceHandler(),
	}); err != nil {
		return err
	}
	if nodeName != "" {
		defer nf.Shutdown()
		if err := watchInformers(ctx, nf, "this node", map[cache.SharedIndexInformer]cache.ResourceEventHandler{nodeInf.Informer(): st.nodeHandler()}); err != nil {
			return err
		}
	} else {
		log.Warn("kubernetes services without this node's name (--node-name or NODE_NAME): internalTrafficPolicy: Local services get no endpoints, topology hints are not used")
	}
	log.Info("kubernetes source synced")
	st.mark(true)
	var retry <-chan time.Time
	backoff := time.Second
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-st.kick:
			// Let a burst of events settle into one apply.
			if !settle(ctx, st.kick, quiet) {
				return nil
			}
		case <-retry:
		}
		retry = nil
		keys, since, err := st.take()
		if err != nil {
			return err
		}
		if since.IsZero() {
			since = time.Now()
		}
		changes, notes, err := st.build(keys, nodeOf(nodeInf.Lister(), nodeName))
		if err != nil {
			return err
		}
		for _, n := range notes {
			log.Debug("kubernetes source", "note", n)
		}
		for _, o := range changes {
			// Each Service stands alone: one that cannot be
			// served is skipped and reported, the others apply.
			if o.Skipped != nil && !o.Skipped.Ignored {
				log.Warn("kubernetes service skipped", "service", o.Key, "reason", o.Skipped.Reason)
			}
		}
		if err := apply(ServiceChanges{Changes: changes, Whole: st.part.Snapshot}, since); err != nil {
			log.Error("applying kubernetes services", "err", err, "retry_in", backoff)
			retry = time.After(backoff)
			backoff = min(2*backoff, 30*time.Second)
			continue
		}
		backoff = time.Second
		log.Info("kubernetes services applied", "changed", len(changes), "services_built", len(keys), "latency", time.Since(since))
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
