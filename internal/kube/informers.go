package kube

import (
	"context"
	"fmt"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// startInformers calls changed on every event of infs, starts the
// factory and waits for the first listing (rbac names what a failed
// listing needs). The caller shuts the factory down.
func startInformers(ctx context.Context, f informers.SharedInformerFactory, changed func(), rbac string, infs ...cache.SharedIndexInformer) error {
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { changed() },
		UpdateFunc: func(any, any) { changed() },
		DeleteFunc: func(any) { changed() },
	}
	for _, inf := range infs {
		if _, err := inf.AddEventHandler(h); err != nil {
			return fmt.Errorf("watching: %w", err)
		}
	}
	return waitInformers(ctx, f, rbac)
}

// watchInformers is startInformers with a handler of each informer's own.
func watchInformers(ctx context.Context, f informers.SharedInformerFactory, rbac string, hs map[cache.SharedIndexInformer]cache.ResourceEventHandler) error {
	for inf, h := range hs {
		if _, err := inf.AddEventHandler(h); err != nil {
			return fmt.Errorf("watching: %w", err)
		}
	}
	return waitInformers(ctx, f, rbac)
}

// waitInformers starts the factory and waits for the first listing (rbac
// names what a failed listing needs).
func waitInformers(ctx context.Context, f informers.SharedInformerFactory, rbac string) error {
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("listing %v from the API server failed (RBAC: get, list and watch %s)", typ, rbac)
		}
	}
	return nil
}

// settle lets a burst of events (kicks) settle: it returns once quiet
// passed without one, or false when ctx ends.
func settle(ctx context.Context, kick <-chan struct{}, quiet time.Duration) bool {
	timer := time.NewTimer(quiet)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-kick:
			if !timer.Stop() {
				<-timer.C
			}
			timer.Reset(quiet)
		case <-timer.C:
			return true
		}
	}
}
