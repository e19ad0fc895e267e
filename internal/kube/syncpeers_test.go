package kube

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestSyncPeers(t *testing.T) {
	now := time.Now()
	pod := func(name, node, ip string, phase corev1.PodPhase, age time.Duration, deleting bool) any {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(now.Add(-age))},
			Spec:       corev1.PodSpec{NodeName: node},
			Status:     corev1.PodStatus{Phase: phase, PodIP: ip},
		}
		if deleting {
			ts := metav1.NewTime(now)
			p.DeletionTimestamp = &ts
		}
		return p
	}
	got := syncPeers([]any{
		pod("a", "node-a", "10.0.0.1", corev1.PodRunning, time.Hour, false),
		pod("b-old", "node-b", "10.0.0.2", corev1.PodRunning, time.Hour, false),
		pod("b-new", "node-b", "10.0.0.22", corev1.PodRunning, time.Minute, false),
		pod("c", "node-c", "", corev1.PodPending, time.Minute, false),
		pod("d", "node-d", "10.0.0.4", corev1.PodRunning, time.Hour, true),
		pod("e", "", "10.0.0.5", corev1.PodRunning, time.Hour, false),
		pod("f", "node-f", "fd00::6", corev1.PodRunning, time.Hour, false),
	}, "7400")
	want := []SyncPeer{{"node-a", "10.0.0.1:7400"}, {"node-b", "10.0.0.22:7400"}, {"node-f", "[fd00::6]:7400"}}
	if len(got) != len(want) {
		t.Fatalf("peers %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("peer %d = %v, want %v", i, got[i], want[i])
		}
	}
	for _, bad := range []string{"", "kube-system", "/app=x", "ns/", "ns/a b c"} {
		if _, _, err := ParsePeerSource(bad); err == nil {
			t.Errorf("ParsePeerSource(%q) accepted", bad)
		}
	}
}
