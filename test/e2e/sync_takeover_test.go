package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/cgroups"
	"github.com/socklane/socklane/internal/statesync"
	"github.com/socklane/socklane/internal/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// cut drops every packet a host-network node sends (its cgroup) and
// every packet to its sync port, in the host's namespace; undone when
// the test ends.
func (b *syncBed) cut(n *syncNode, on bool) {
	b.t.Helper()
	root, err := cgroups.Root()
	if err != nil {
		b.t.Fatal(err)
	}
	rel := strings.TrimPrefix(n.pod.Cgroup, root)
	_, port, _ := strings.Cut(n.addr, ":")
	rules := [][]string{
		{"OUTPUT", "-m", "cgroup", "--path", rel, "-j", "DROP"},
		{"OUTPUT", "-p", "tcp", "-d", "127.0.0.1", "--dport", port, "-j", "DROP"},
	}
	for _, r := range rules {
		op := "-I"
		if !on {
			op = "-D"
		}
		args := append([]string{"-w", op}, r...)
		if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
			b.t.Fatalf("iptables %v: %v: %s", args, err, out)
		}
		if on {
			undo := append([]string{"-w", "-D"}, r...)
			b.t.Cleanup(func() { _ = exec.Command("iptables", undo...).Run() })
		}
	}
}

// destroyOrphans destroys the sockets of killed nodes that still
// connect to n's sync port (sock_diag destroy, as ss -K), and fails
// unless none is left.
func (b *syncBed) destroyOrphans(n *syncNode) {
	b.t.Helper()
	_, port, _ := strings.Cut(n.addr, ":")
	filter := []string{"dport", "=", ":" + port}
	killed, err := exec.Command("ss", append([]string{"-K", "-H", "-t", "-n"}, filter...)...).CombinedOutput()
	if err != nil {
		b.t.Fatalf("ss -K %v: %v: %s", filter, err, killed)
	}
	b.t.Logf("destroyed the orphans to %s's sync port:\n%s", n.name, killed)
	out, err := exec.Command("ss", append([]string{"-H", "-t", "-n"}, filter...)...).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		b.t.Fatalf("sockets to %s's sync port left after ss -K (%v): %s", n.name, err, out)
	}
}

// waitStatus waits until f holds for a node's sync status.
func (b *syncBed) waitStatus(n *syncNode, what string, d time.Duration, f func(statesync.Status) bool) statesync.Status {
	b.t.Helper()
	deadline := time.Now().Add(d)
	for {
		st, err := b.status(n)
		if err == nil && f(st) {
			return st
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s: not %s after %s (%v): %+v\n%s", n.name, what, d, err, st, n.logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSyncTakeover: an active-standby pair elected through a Lease on the
// real API server, with a third standby. The standby that wins the lease
// after the active is killed was cut off while the active wrote its last
// changes: it must get them (from the other standby) before it takes
// over, and then the map holds exactly what the dead active wrote.
func TestSyncTakeover(t *testing.T) {
	api := testutil.StartAPIServer(t)
	b := newSyncBedOn(t, true, "node-a", "node-b", "node-c")
	b.tableOpts = ",mode=active-standby"
	b.extra = []string{"--kubeconfig", api.Kubeconfig}
	lease := []string{"--sync-lease", "default/sync-pair", "--sync-lease-duration", "3s", "--sync-takeover-timeout", "30s"}
	b.nodeArgs["node-a"], b.nodeArgs["node-b"] = lease, lease
	a, bn, c := b.nodes[0], b.nodes[1], b.nodes[2]
	b.start(a)
	b.waitStatus(a, "the lease holder", 20*time.Second, func(st statesync.Status) bool { return st.Takeover.Leader })
	b.start(bn)
	b.start(c)
	// It takes over once it heard from both standbys.
	b.waitStatus(a, "active", 20*time.Second, func(st statesync.Status) bool { return st.Active })
	b.bootstrapped()
	rng := rand.New(rand.NewPCG(11, 12))
	b.churn(rng, []*syncNode{a}, 2000, 0, 1500)
	b.converged(20 * time.Second)
	// The standbys know which node is active (it says so in heartbeats).
	for _, n := range []*syncNode{bn, c} {
		b.waitStatus(n, "told node-a is active", 10*time.Second, func(st statesync.Status) bool {
			for _, p := range st.Peers {
				if p.Name == "node-a" && p.Active {
					return true
				}
			}
			return false
		})
	}

	// node-b cut off; node-a writes on; node-c gets it all.
	b.cut(bn, true)
	b.churn(rng, []*syncNode{a}, 3000, 0, 1500)
	final := b.dumps(a)
	deadline := time.Now().Add(20 * time.Second)
	for d := b.dumps(c); !sameDumps(d, final); d = b.dumps(c) {
		if time.Now().After(deadline) {
			t.Fatal("node-c never got node-a's last changes")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if sameDumps(b.dumps(bn), final) {
		t.Fatal("node-b got node-a's last changes through the cut: the test proves nothing")
	}
	b.kill(a)
	// A crashed node sends nothing more, but a killed process's sockets
	// live on as orphans that retransmit what they still hold: once the
	// cut is lifted node-a's connection to node-b would hand node-b the
	// changes this test wants it to ask node-c for (node-a dials node-b,
	// so the orphan is the socket whose destination is node-b's port).
	b.destroyOrphans(bn)
	b.cut(bn, false)

	st := b.waitStatus(bn, "active", 60*time.Second, func(st statesync.Status) bool { return st.Active })
	if !sameDumps(b.dumps(bn), final) {
		t.Fatal("node-b took over without every change node-a made before it died")
	}
	tk := st.Takeover
	if !tk.Leader || tk.TookOver.Before(tk.Since) {
		t.Fatalf("takeover: %+v", tk)
	}
	took := false
	for _, p := range st.Peers {
		if p.Name == "node-c" && strings.Contains(p.Resync, "takeover") {
			took = true
		}
	}
	if !took {
		t.Errorf("node-b did not ask node-c for what it missed: %+v", st.Peers)
	}
	t.Logf("node-b won the lease %d changes behind, took over %s later", tk.AtLease, tk.TookOver.Sub(tk.Since).Round(time.Millisecond))
	for _, l := range strings.Split(bn.logs.String(), "\n") {
		if strings.Contains(l, "sync:") {
			t.Log(l)
		}
	}

	// The new active publishes: node-c follows it.
	b.churn(rng, []*syncNode{bn}, 500, 0, 1500)
	b.nodes = []*syncNode{bn, c}
	b.converged(20 * time.Second)
	if st, err := b.status(c); err != nil || st.Active {
		t.Fatalf("node-c (no lease) active: %v %v", st.Active, err)
	}
}

func sameDumps(a, b [2]map[string]string) bool {
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return false
		}
		for k, v := range a[i] {
			if b[i][k] != v {
				return false
			}
		}
	}
	return true
}

// TestSyncPeersFromAPI: agents find each other as the pods of their
// DaemonSet (running pods with an address, one per node) through the
// API server; a pod that goes away drops its node from the others'
// peers, and coming back brings it in again.
func TestSyncPeersFromAPI(t *testing.T) {
	api := testutil.StartAPIServer(t)
	b := newSyncBedOn(t, true, "node-a", "node-b", "node-c")
	// One port on every node, as a DaemonSet has; the nodes are loopback
	// addresses of their own.
	_, port, _ := strings.Cut(testutil.FreeAddr(t), ":")
	for i, n := range b.nodes {
		n.addr = fmt.Sprintf("127.0.0.%d:%s", 2+i, port)
	}
	const ns = "socklane-sync"
	ctx := context.Background()
	if _, err := api.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	podOf := func(n *syncNode) {
		t.Helper()
		host, _, _ := strings.Cut(n.addr, ":")
		p, err := api.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "agent-" + n.name, Labels: map[string]string{"app": "socklane-agent"}},
			Spec:       corev1.PodSpec{NodeName: n.name, Containers: []corev1.Container{{Name: "agent", Image: "socklane"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: host, PodIPs: []corev1.PodIP{{IP: host}}}
		if _, err := api.Client.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range b.nodes {
		podOf(n)
	}
	b.extra = []string{"--kubeconfig", api.Kubeconfig, "--sync-peers-from", ns + "/app=socklane-agent"}
	// The static peers the bed would give are replaced by the pods.
	for _, n := range b.nodes {
		args := b.args(n)
		var kept []string
		for i := 0; i < len(args); i++ {
			if args[i] == "--sync-peer" {
				i++
				continue
			}
			kept = append(kept, args[i])
		}
		b.start1(n, kept)
	}
	b.bootstrapped()
	rng := rand.New(rand.NewPCG(13, 14))
	b.churn(rng, b.nodes, 2000, 0, 1500)
	b.converged(20 * time.Second)
	a, c := b.nodes[0], b.nodes[2]
	if st, err := b.status(a); err != nil || len(st.Peers) != 2 {
		t.Fatalf("node-a's peers: %+v %v", st.Peers, err)
	}

	if err := api.Client.CoreV1().Pods(ns).Delete(ctx, "agent-node-c", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	b.waitStatus(a, "without node-c", 20*time.Second, func(st statesync.Status) bool {
		return len(st.Peers) == 1 && st.Peers[0].Name == "node-b"
	})
	podOf(c)
	b.waitStatus(a, "with node-c again", 20*time.Second, func(st statesync.Status) bool {
		for _, p := range st.Peers {
			if p.Name == "node-c" && p.Connected {
				return true
			}
		}
		return false
	})
	b.churn(rng, b.nodes, 1000, 0, 1500)
	b.converged(20 * time.Second)
}
