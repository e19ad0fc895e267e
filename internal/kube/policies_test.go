package kube

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/socklane/socklane/internal/policy"
	"github.com/socklane/socklane/internal/testutil"
)

// fakeRemote is a pod table whose peers' state arrives when the test
// says so.
type fakeRemote struct {
	mu        sync.Mutex
	published [][]*policy.Pod
	others    []*policy.Pod
	ready     chan struct{}
	changed   chan struct{}
}

func (r *fakeRemote) Publish(local []*policy.Pod) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.published = append(r.published, local)
	return nil
}

func (r *fakeRemote) Pods() ([]*policy.Pod, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*policy.Pod, 0, len(r.others))
	for _, p := range r.others {
		c := *p
		c.IPs = append([]netip.Addr(nil), p.IPs...)
		out = append(out, &c)
	}
	return out, nil
}

func (r *fakeRemote) Changed() <-chan struct{} { return r.changed }
func (r *fakeRemote) Ready() <-chan struct{}   { return r.ready }
func (r *fakeRemote) Prune(func(string) bool, int) (bool, error) {
	return false, nil
}

// TestWatchPoliciesWaitsForRemote: with the other nodes' pods from a
// pod table, no policy is applied before the table holds what the peers
// published (a set without them would deny what the policies allow to
// any of them); once it does, the first set applied has them.
func TestWatchPoliciesWaitsForRemote(t *testing.T) {
	api := testutil.StartAPIServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := api.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Client.NetworkingV1().NetworkPolicies("x").Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
			PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}},
		}}}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	remote := &fakeRemote{ready: make(chan struct{}), changed: make(chan struct{}, 1), others: []*policy.Pod{{
		Namespace: "x", Name: "b", Labels: map[string]string{"role": "client"}, IPs: []netip.Addr{netip.MustParseAddr("198.18.2.2")},
	}}}
	applied := make(chan *policy.Set, 16)
	done := make(chan error, 1)
	go func() {
		done <- WatchPolicies(ctx, api.Config, "node-1", 10*time.Millisecond, func() map[string]string { return nil }, remote,
			func(s *policy.Set) error { applied <- s; return nil }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	// The informers sync in well under this; the policy source then has
	// everything but the peers' state, for three of its one-second ticks.
	select {
	case s := <-applied:
		t.Fatalf("a set applied before the pod table was ready: %d policies, %d pods", len(s.Policies), len(s.Pods))
	case err := <-done:
		t.Fatalf("WatchPolicies ended: %v", err)
	case <-time.After(3 * time.Second):
	}
	close(remote.ready)
	remote.changed <- struct{}{}
	select {
	case s := <-applied:
		if len(s.Policies) != 1 || len(s.Pods) != 1 || s.Pods[0].Key() != "x/b" {
			t.Errorf("first set applied: %d policies, pods %v; want the policy and the remote x/b", len(s.Policies), s.Pods)
		}
	case err := <-done:
		t.Fatalf("WatchPolicies ended: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no set applied once the pod table was ready")
	}
	remote.mu.Lock()
	n := len(remote.published)
	remote.mu.Unlock()
	if n == 0 {
		t.Error("this node's pods were never published")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("WatchPolicies: %v", err)
	}
}
