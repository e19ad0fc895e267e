package kube

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// LocalPod is a pod of this node as the API server describes it.
type LocalPod struct {
	Key string   // namespace/name
	IPs []string // its addresses, once assigned
}

// PodSet is the pods of one node that match a label selector, kept
// current by a watch; safe for concurrent use.
type PodSet struct {
	mu   sync.Mutex
	pods map[string]LocalPod // by UID
}

// UIDs returns the matching pods' UIDs with their descriptions.
func (s *PodSet) UIDs() map[string]LocalPod {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]LocalPod, len(s.pods))
	for k, v := range s.pods {
		out[k] = v
	}
	return out
}

func (s *PodSet) set(p *corev1.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || p.DeletionTimestamp != nil {
		delete(s.pods, string(p.UID))
		return
	}
	lp := LocalPod{Key: p.Namespace + "/" + p.Name}
	for _, ip := range p.Status.PodIPs {
		lp.IPs = append(lp.IPs, ip.IP)
	}
	s.pods[string(p.UID)] = lp
}

func (s *PodSet) remove(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if p, ok := obj.(*corev1.Pod); ok {
		s.mu.Lock()
		delete(s.pods, string(p.UID))
		s.mu.Unlock()
	}
}

// WatchPods watches the pods scheduled to node whose labels match
// selector (Kubernetes label selector syntax) until ctx ends; the set is
// ready when WatchPods returns without error.
func WatchPods(ctx context.Context, cfg *rest.Config, node, selector string, log *slog.Logger) (*PodSet, error) {
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil, fmt.Errorf("--kube-pod-selector %q: %w", selector, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the Kubernetes client: %w", err)
	}
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
		o.LabelSelector = sel.String()
	}))
	set := &PodSet{pods: map[string]LocalPod{}}
	inf := f.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { set.set(o.(*corev1.Pod)) },
		UpdateFunc: func(_, o any) { set.set(o.(*corev1.Pod)) },
		DeleteFunc: set.remove,
	}); err != nil {
		return nil, err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, fmt.Errorf("listing the pods of node %s failed (RBAC: get, list and watch pods)", node)
	}
	log.Info("watching this node's pods", "node", node, "selector", sel.String())
	return set, nil
}
