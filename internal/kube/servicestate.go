package kube

import (
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/socklane/socklane/internal/service"
)

// byService indexes EndpointSlices by their Service (namespace/name).
const byService = "service"

// sliceService is the namespace/name of the Service an EndpointSlice
// belongs to ("" if none).
func sliceService(obj any) string {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	es, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok || es.Labels[discoveryv1.LabelServiceName] == "" {
		return ""
	}
	return es.Namespace + "/" + es.Labels[discoveryv1.LabelServiceName]
}

func indexByService(obj any) ([]string, error) {
	if k := sliceService(obj); k != "" {
		return []string{k}, nil
	}
	return nil, nil
}

// serviceState turns the informers' events into changes of the service
// model at their own cost: an event marks its Service (a Service's key,
// an EndpointSlice's Service, old and new); a batch builds only the marked
// Services from the caches (their slices through the index) and judges
// them with a service.Partitioner. A change of this node (its zone, its
// addresses) marks every Service.
type serviceState struct {
	mu    sync.Mutex
	dirty map[string]bool
	all   bool
	first time.Time // first event of the pending batch
	kick  chan struct{}

	svcs   corelisters.ServiceLister
	slices cache.Indexer
	part   *service.Partitioner
	known  map[string]bool // keys given to part
}

func newServiceState(svcs corelisters.ServiceLister, slices cache.Indexer, budget service.Budget) *serviceState {
	return &serviceState{
		dirty: map[string]bool{}, kick: make(chan struct{}, 1), svcs: svcs, slices: slices,
		part: service.NewPartitioner(budget), known: map[string]bool{},
	}
}

// mark notes keys changed ("" ignored); every marks all.
func (st *serviceState) mark(every bool, keys ...string) {
	st.mu.Lock()
	if st.first.IsZero() {
		st.first = time.Now()
	}
	st.all = st.all || every
	for _, k := range keys {
		if k != "" {
			st.dirty[k] = true
		}
	}
	st.mu.Unlock()
	select {
	case st.kick <- struct{}{}:
	default:
	}
}

func (st *serviceState) serviceHandler() cache.ResourceEventHandler {
	key := func(obj any) string {
		k, _ := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		return k
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { st.mark(false, key(obj)) },
		UpdateFunc: func(_, obj any) { st.mark(false, key(obj)) },
		DeleteFunc: func(obj any) { st.mark(false, key(obj)) },
	}
}

func (st *serviceState) sliceHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { st.mark(false, sliceService(obj)) },
		UpdateFunc: func(old, obj any) { st.mark(false, sliceService(old), sliceService(obj)) },
		DeleteFunc: func(obj any) { st.mark(false, sliceService(obj)) },
	}
}

func (st *serviceState) nodeHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { st.mark(true) },
		UpdateFunc: func(any, any) { st.mark(true) },
		DeleteFunc: func(any) { st.mark(true) },
	}
}

// take ends the pending batch: the keys to build and its first event.
func (st *serviceState) take() (keys []string, since time.Time, err error) {
	st.mu.Lock()
	dirty, all, since := st.dirty, st.all, st.first
	st.dirty, st.all, st.first = map[string]bool{}, false, time.Time{}
	st.mu.Unlock()
	if all {
		list, err := st.svcs.List(labels.Everything())
		if err != nil {
			return nil, since, fmt.Errorf("listing services: %w", err)
		}
		for _, k := range list {
			dirty[k.Namespace+"/"+k.Name] = true
		}
		for k := range st.known {
			dirty[k] = true
		}
	}
	for k := range dirty {
		keys = append(keys, k)
	}
	return keys, since, nil
}

// build builds keys from the caches for node and returns the outcomes
// that changed, with notes for the log.
func (st *serviceState) build(keys []string, node Node) ([]service.Outcome, []string, error) {
	var notes []string
	for _, key := range keys {
		ns, name, err := cache.SplitMetaNamespaceKey(key)
		if err != nil {
			continue
		}
		k, err := st.svcs.Services(ns).Get(name)
		if apierrors.IsNotFound(err) {
			st.part.Delete(key)
			delete(st.known, key)
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("reading service %s: %w", key, err)
		}
		objs, err := st.slices.ByIndex(byService, key)
		if err != nil {
			return nil, nil, fmt.Errorf("reading the endpointslices of %s: %w", key, err)
		}
		eps := make([]*discoveryv1.EndpointSlice, 0, len(objs))
		for _, o := range objs {
			if es, ok := o.(*discoveryv1.EndpointSlice); ok {
				eps = append(eps, es)
			}
		}
		s, ignored, n := buildOne(k, eps, node)
		notes = append(notes, n...)
		switch {
		case ignored != nil:
			st.part.Ignore(*ignored)
			st.known[key] = true
		case s != nil:
			st.part.Put(s)
			st.known[key] = true
		default:
			st.part.Delete(key)
			delete(st.known, key)
		}
	}
	return st.part.Flush(), notes, nil
}

// nodeOf is this node as its Node object says (name only if absent).
func nodeOf(nodes corelisters.NodeLister, name string) Node {
	node := Node{Name: name}
	if name == "" {
		return node
	}
	if n, err := nodes.Get(name); err == nil {
		node.Zone = n.Labels[corev1.LabelTopologyZone]
		node.Addrs = nodeAddrs(n)
	}
	return node
}
