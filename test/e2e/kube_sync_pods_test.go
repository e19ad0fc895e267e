package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cilium/ebpf"

	"github.com/socklane/socklane/internal/bpffs"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/podtable"
	"github.com/socklane/socklane/internal/statesync"
	"github.com/socklane/socklane/internal/testutil"
)

// TestSyncPodIdentities: with --sync-pods, node-1's agent watches only its
// own pods and learns the other nodes' from the state sync's pod table.
// One runtime holds every pod; the API server places x/a on node-1, y/b
// on node-2 (whose agent publishes it) and y/c on node-3 (no agent: nobody
// publishes it). x/a admits pods labelled role=client of namespace y: y/b
// reaches it (judged at x/a's ingress by the address node-2 published),
// y/c does not (its address is no pod's on node-1, which does not watch
// node-3's pods), and y/b relabelled on the API server is refused once
// node-2 publishes the change.
func TestSyncPodIdentities(t *testing.T) {
	api := testutil.StartAPIServer(t)
	rt := testutil.StartContainerd(t)
	ctx := context.Background()
	labelledNamespaces(t, api, "x", "y")
	// The cluster lists node-1 and node-2 (node-3 too: a node whose
	// agent publishes nothing).
	for _, n := range []string{"node-1", "node-2", "node-3"} {
		if _, err := api.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	client := map[string]string{"role": "client"}
	refs := runKubePods(t, api, rt, []kubePod{
		{ns: "x", name: "a", node: "node-1"},
		{ns: "y", name: "b", node: "node-2", labels: client},
		{ns: "y", name: "c", node: "node-3", labels: client},
	})
	if _, err := api.Client.NetworkingV1().NetworkPolicies("x").Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "clients-of-y"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": "y"}},
				PodSelector:       &metav1.LabelSelector{MatchLabels: client},
			}}}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	certs := t.TempDir()
	nodes := []string{"node-1", "node-2"}
	if err := statesync.MakeCerts(certs, nodes, time.Hour); err != nil {
		t.Fatal(err)
	}
	addrs := map[string]string{"node-1": testutil.FreeAddr(t), "node-2": testutil.FreeAddr(t)}
	ins := map[string]*testutil.Instance{}
	logs := map[string]*lockedBuffer{}
	stops := map[string]func(){}
	for _, n := range nodes {
		in := testutil.NewInstance(t)
		ins[n], logs[n] = in, &lockedBuffer{}
		args := []string{"--name", in.Name, "agent", "--kube-pod-selector", "app=np", "--node-name", n,
			"--cri-socket", rt.Socket, "--pod-interval", "200ms", "--kube-policies", "--kubeconfig", api.Kubeconfig,
			"--metrics-address", "", "--sync-pods", "--sync-listen", addrs[n],
			"--sync-ca", filepath.Join(certs, "ca.pem"), "--sync-cert", filepath.Join(certs, n+".pem"),
			"--sync-key", filepath.Join(certs, n+"-key.pem"), "--sync-bootstrap-timeout", "3s", "--sync-pods-node-grace", "2s"}
		for _, o := range nodes {
			if o != n {
				args = append(args, "--sync-peer", o+"="+addrs[o])
			}
		}
		agent := exec.Command(in.Bin, append(args, in.Settings...)...)
		agent.Stdout, agent.Stderr = logs[n], logs[n]
		if err := agent.Start(); err != nil {
			t.Fatal(err)
		}
		stops[n] = func() { _ = agent.Process.Kill(); _ = agent.Wait() }
		t.Cleanup(stops[n])
	}
	n1 := ins["node-1"]
	// node-1 manages x/a only: y/b and y/c are other nodes' (node-2's
	// agent manages y/b).
	waitForLog(t, logs["node-1"], func() bool {
		m, m2 := managedPods(t, n1, rt.Socket), managedPods(t, ins["node-2"], rt.Socket)
		return m["x/a"] && !m["y/b"] && !m["y/c"] && m2["y/b"] && !m2["x/a"]
	})
	// node-1 publishes x/a and takes y/b from node-2 once its sync has
	// the peers' state (a connection before it applied its policies would
	// be allowed whatever the table holds).
	waitForLog(t, logs["node-1"], func() bool {
		tb := podTable(t, n1)
		return tb[refs["x/a"].ip] == "node-1 x/a" && tb[refs["y/b"].ip] == "node-2 y/b" &&
			strings.Contains(logs["node-1"].String(), "other_nodes_pods=1")
	})
	toA := refs["x/a"].ip + ":80/tcp"
	waitForLog(t, logs["node-1"], func() bool { return reachFromPod(t, rt, refs["y/b"], toA) == "ok" })
	// Dropped at x/a's ingress; or, when node-1 applies its policies
	// while the SYN is retried, destroyed as a connection they deny (one
	// host holds every node's pods here, so node-1 sees y/c's socket).
	if got := reachFromPod(t, rt, refs["y/c"], toA); got != "timeout" && got != "ECONNABORTED" {
		t.Errorf("y/c (node-3, published by nobody) -> x/a: %s, want timeout (its SYN dropped at x/a's ingress)", got)
	}
	// The table on node-1, as the kernel holds it: node-1's pod and
	// node-2's, nothing of node-3.
	table := podTable(t, n1)
	if table[refs["x/a"].ip] != "node-1 x/a" || table[refs["y/b"].ip] != "node-2 y/b" || table[refs["y/c"].ip] != "" {
		t.Errorf("node-1's pod table: %v\nnode-1's log:\n%s", table, logs["node-1"].String())
	}
	// What node-1 enforces names y/b by its published labels.
	out := n1.MustRun("policy", "test", "--from", refs["y/b"].ip, "--to", "x/a:80/tcp")
	if !strings.Contains(out, "allowed") || !strings.Contains(out, "clients-of-y") {
		t.Errorf("policy test from y/b on node-1: %s", out)
	}

	// y/b relabelled: node-2 publishes it, node-1 refuses it.
	pod, err := api.Client.CoreV1().Pods("y").Get(ctx, "b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Labels["role"] = "other"
	if _, err := api.Client.CoreV1().Pods("y").Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForLog(t, logs["node-1"], func() bool { return reachFromPod(t, rt, refs["y/b"], toA) == "timeout" })
	// Its pod deleted on the API server: node-2 deletes its record.
	if err := api.Client.CoreV1().Pods("y").Delete(ctx, "b", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitForLog(t, logs["node-1"], func() bool { return podTable(t, n1)[refs["y/b"].ip] == "" })
	if !strings.Contains(logs["node-1"].String(), "this node's, the others' through the sync") {
		t.Errorf("node-1 did not say it watches only its own pods:\n%s", logs["node-1"].String())
	}

	// node-2 leaves the cluster for good with a pod published: its agent
	// ends, its Node object is deleted, and node-1 deletes the records
	// nobody else would, once node-2 has been missing for the grace.
	d := runKubePods(t, api, rt, []kubePod{{ns: "y", name: "d", node: "node-2", labels: client}})["y/d"]
	waitForLog(t, logs["node-1"], func() bool { return podTable(t, n1)[d.ip] == "node-2 y/d" })
	stops["node-2"]()
	if err := api.Client.CoreV1().Nodes().Delete(ctx, "node-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The agent logs the prune after it deleted the records: wait for
	// both (the log line follows the map by a moment).
	waitForLog(t, logs["node-1"], func() bool {
		return podTable(t, n1)[d.ip] == "" &&
			strings.Contains(logs["node-1"].String(), "records of nodes the cluster no longer lists deleted")
	})
	if table := podTable(t, n1); table[refs["x/a"].ip] != "node-1 x/a" {
		t.Errorf("node-1's pod table after node-2 left: %v, want node-1's own x/a", table)
	}
}

// podTable reads an instance's pinned pod table: "NODE NS/NAME" by
// address.
func podTable(t *testing.T, in *testutil.Instance) map[string]string {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(bpffs.DefaultPath, in.Name, datapath.PodTableName), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	recs, bad, err := podtable.Read(m)
	if err != nil || bad != 0 {
		t.Fatalf("reading the pod table: %v (%d records that do not decode)", err, bad)
	}
	out := map[string]string{}
	for a, r := range recs {
		out[a.String()] = r.Node + " " + r.Namespace + "/" + r.Name
	}
	return out
}
