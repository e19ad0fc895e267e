package e2e

import (
	"context"
	"encoding/json"
	"maps"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/socklane/socklane/internal/peer"
	"github.com/socklane/socklane/internal/testutil"
)

// kubePod is a pod to run: its API object on node, labelled app=np,
// pod=NAME and labels, with a named port serve-80-tcp; the container
// answers whoami on ports 80 and 81 with ns/name.
type kubePod struct {
	ns, name, node string
	labels         map[string]string
}

// podRef is a running kubePod.
type podRef struct{ ns, name, uid, container, ip string }

// labelledNamespaces creates namespaces labelled ns=NAME.
func labelledNamespaces(t *testing.T, api *testutil.APIServer, names ...string) {
	t.Helper()
	for _, ns := range names {
		if _, err := api.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{
			ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"ns": ns}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// runKubePods creates the pods' API objects, runs them in the runtime
// and writes their addresses to the API (the kubelet's part). By ns/name.
func runKubePods(t *testing.T, api *testutil.APIServer, rt *testutil.Runtime, pods []kubePod) map[string]*podRef {
	t.Helper()
	ctx := context.Background()
	refs := map[string]*podRef{}
	for _, p := range pods {
		labels := map[string]string{"app": "np", "pod": p.name}
		maps.Copy(labels, p.labels)
		pod, err := api.Client.CoreV1().Pods(p.ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: labels},
			Spec: corev1.PodSpec{NodeName: p.node, Containers: []corev1.Container{{Name: "c", Image: testutil.PeerImage,
				Ports: []corev1.ContainerPort{{Name: "serve-80-tcp", ContainerPort: 80, Protocol: corev1.ProtocolTCP}}}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		label := p.ns + "/" + p.name
		rt.RunPodUID(p.ns, p.name, string(pod.UID), map[string]string{"app": "np"},
			testutil.ContainerSpec{Name: "whoami", Args: []string{"peer", "whoami", "0.0.0.0", "--ports", "80-81", "--label", label}})
		refs[label] = &podRef{ns: p.ns, name: p.name, uid: string(pod.UID)}
	}
	for key, cp := range criPods(t, rt) {
		r := refs[key]
		if r == nil {
			continue
		}
		r.ip, r.container = cp.IP, cp.Containers[0].ID
		pod, err := api.Client.CoreV1().Pods(r.ns).Get(ctx, r.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod.Status.Phase = corev1.PodRunning
		pod.Status.PodIP = cp.IP
		pod.Status.PodIPs = []corev1.PodIP{{IP: cp.IP}}
		if _, err := api.Client.CoreV1().Pods(r.ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for key, r := range refs {
		if r.ip == "" {
			t.Fatalf("pod %s: not in the runtime", key)
		}
	}
	return refs
}

// reachFromPod runs `socklane peer reach` in a pod's container and returns its
// result ("ok", "timeout", an errno name).
func reachFromPod(t *testing.T, rt *testutil.Runtime, from *podRef, target string) string {
	t.Helper()
	out, err := rt.Exec(from.container, 30*time.Second, "/socklane", "peer", "reach", "--timeout", "2s", target)
	if err != nil {
		t.Fatalf("reach from %s/%s: %v: %s", from.ns, from.name, err, out)
	}
	var res []peer.Reach
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res) != 1 {
		t.Fatalf("reach from %s/%s: %q: %v", from.ns, from.name, out, err)
	}
	return res[0].Result
}

// TestKubePolicies enforces NetworkPolicies from the real API server on
// pods of the container runtime: a policy created, a namespace
// relabelled and the policy deleted each change what the pods may reach,
// with named ports resolved from the API server's pod specs.
func TestKubePolicies(t *testing.T) {
	api := testutil.StartAPIServer(t)
	rt := testutil.StartContainerd(t)
	in := testutil.NewInstance(t)
	ctx := context.Background()
	labelledNamespaces(t, api, "x", "y")
	refs := runKubePods(t, api, rt, []kubePod{
		{ns: "x", name: "a", node: "node-1"}, {ns: "x", name: "b", node: "node-1"}, {ns: "y", name: "b", node: "node-1"}})
	var logs lockedBuffer
	agent := exec.Command(in.Bin, "--name", in.Name, "agent", "--kube-pod-selector", "app=np", "--node-name", "node-1",
		"--cri-socket", rt.Socket, "--pod-interval", "200ms", "--kube-policies", "--kubeconfig", api.Kubeconfig, "--metrics-address", "")
	agent.Stdout, agent.Stderr = &logs, &logs
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = agent.Process.Kill(); _ = agent.Wait() })
	probe := func(from string, port string) string {
		t.Helper()
		return reachFromPod(t, rt, refs[from], refs["x/a"].ip+":"+port+"/tcp")
	}
	enforced := func(want string) {
		t.Helper()
		waitForLog(t, &logs, func() bool {
			out, err := in.Run("policy", "list")
			return err == nil && strings.Contains(out, want)
		})
	}
	waitForLog(t, &logs, func() bool {
		m := managedPods(t, in, rt.Socket)
		return m["x/a"] && m["x/b"] && m["y/b"]
	})
	if _, err := api.Client.NetworkingV1().NetworkPolicies("x").Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "from-y"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": "a"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"ns": "y"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptr(intstr.FromString("serve-80-tcp"))}},
			}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	enforced("x/from-y")
	waitForLog(t, &logs, func() bool { return probe("x/b", "80") == "EPERM" })
	for _, c := range []struct{ from, port, want string }{
		{"y/b", "80", "ok"}, {"y/b", "81", "EPERM"}, {"x/b", "80", "EPERM"},
	} {
		if got := probe(c.from, c.port); got != c.want {
			t.Errorf("%s -> x/a:%s under x/from-y: %s, want %s", c.from, c.port, got, c.want)
		}
	}
	// Namespace y loses its label: y/b is no longer let in.
	ns, err := api.Client.CoreV1().Namespaces().Get(ctx, "y", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels["ns"] = "elsewhere"
	if _, err := api.Client.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForLog(t, &logs, func() bool { return probe("y/b", "80") == "EPERM" })
	// The policy deleted: x/a is open again.
	if err := api.Client.NetworkingV1().NetworkPolicies("x").Delete(ctx, "from-y", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForLog(t, &logs, func() bool { return probe("x/b", "81") == "ok" })
}
