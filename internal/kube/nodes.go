package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
)

// nodeNames watches the cluster's nodes' metadata only (a Node's status,
// most of its size, is never cached: a large cluster's nodes stay cheap
// in every agent) and returns what lists their names. stop ends the
// watch.
func nodeNames(ctx context.Context, cfg *rest.Config) (names func() (map[string]bool, error), stop func(), err error) {
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the Kubernetes metadata client: %w", err)
	}
	f := metadatainformer.NewSharedInformerFactory(mc, 0)
	inf := f.ForResource(corev1.SchemeGroupVersion.WithResource("nodes"))
	inf.Informer()
	f.Start(ctx.Done())
	for gvr, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			f.Shutdown()
			return nil, nil, fmt.Errorf("listing %s from the API server failed (RBAC: get, list and watch nodes)", gvr.Resource)
		}
	}
	names = func() (map[string]bool, error) {
		objs, err := inf.Lister().List(labels.Everything())
		if err != nil {
			return nil, err
		}
		out := make(map[string]bool, len(objs))
		for _, o := range objs {
			m, err := meta.Accessor(o)
			if err != nil {
				return nil, err
			}
			out[m.GetName()] = true
		}
		return out, nil
	}
	return names, f.Shutdown, nil
}
