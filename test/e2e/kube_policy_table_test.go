package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/kube"
	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/policy"
	"github.com/socklane/socklane/internal/policy/netpoltest"
	"github.com/socklane/socklane/internal/testutil"
)

// TestPolicyTruthTableAPI runs the truth table through the real API
// server: each scenario's NetworkPolicies are created there (validated
// and defaulted by it; the previous scenario's deleted), pods relabelled
// there, and what the API server lists is built into the policy model by
// the agent's own builder (kube.BuildPolicies) with the pods' cgroups,
// programmed and probed on the kernel. (TestKubePolicies runs the agent
// itself with the container runtime.)
func TestPolicyTruthTableAPI(t *testing.T) {
	api := testutil.StartAPIServer(t)
	pb := newPolicyBed(t)
	ctx := context.Background()
	cs := api.Client
	a := pb.addressing()
	for _, ns := range netpoltest.Namespaces {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
			ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"ns": ns}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	local := map[string]string{} // pod UID -> cgroup
	for _, p := range netpoltest.Pods() {
		var ports []corev1.ContainerPort
		for _, sp := range netpoltest.ServerPorts {
			proto := corev1.ProtocolTCP
			if sp.Proto == "udp" {
				proto = corev1.ProtocolUDP
			}
			ports = append(ports, corev1.ContainerPort{Name: fmt.Sprintf("serve-%d-%s", sp.Port, sp.Proto), ContainerPort: int32(sp.Port), Protocol: proto})
		}
		pod, err := cs.CoreV1().Pods(p.NS).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.Name, Labels: map[string]string{"pod": p.Name}},
			Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "c", Image: "peer", Ports: ports}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod.Status.Phase = corev1.PodRunning
		pod.Status.PodIPs = []corev1.PodIP{{IP: a.IPs[p].String()}}
		pod.Status.PodIP = a.IPs[p].String()
		if _, err := cs.CoreV1().Pods(p.NS).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		local[string(pod.UID)] = a.Cgroups[p]
	}
	dp, err := datapath.Open(datapath.Config{PinDir: filepath.Join("/sys/fs/bpf", pb.in.Name)})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	log := slog.New(slog.DiscardHandler)
	for i, sc := range netpoltest.Scenarios() {
		// The scenario's objects, as its policy file has them.
		src, err := sc.File(a)
		if err != nil {
			t.Fatal(err)
		}
		want, err := policy.Parse([]byte(src))
		if err != nil {
			t.Fatal(err)
		}
		for _, ns := range netpoltest.Namespaces {
			if err := cs.NetworkingV1().NetworkPolicies(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range want.Policies {
			if _, err := cs.NetworkingV1().NetworkPolicies(p.Namespace).Create(ctx, p.Source, metav1.CreateOptions{}); err != nil {
				t.Fatalf("scenario %s: creating %s: %v", sc.Name, p.Key(), err)
			}
		}
		for _, p := range want.Pods {
			pod, err := cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !labels.Equals(pod.Labels, p.Labels) {
				pod.Labels = p.Labels
				if _, err := cs.CoreV1().Pods(p.Namespace).Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
		}
		// What the API server lists, as the agent's informers see it.
		var nps []*networkingv1.NetworkPolicy
		var nss []*corev1.Namespace
		var pods []*corev1.Pod
		npl, err := cs.NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range npl.Items {
			nps = append(nps, &npl.Items[i])
		}
		nsl, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range nsl.Items {
			nss = append(nss, &nsl.Items[i])
		}
		pl, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range pl.Items {
			pods = append(pods, &pl.Items[i])
		}
		set, notes := kube.BuildPolicies(nps, nss, pods, "node-1", local)
		if len(notes) > 0 || len(set.Policies) != len(want.Policies) {
			t.Fatalf("scenario %s: built %d policies of %d: %v", sc.Name, len(set.Policies), len(want.Policies), notes)
		}
		if _, err := node.ApplyPolicies(dp, pb.in.Name, set, log); err != nil {
			t.Fatal(err)
		}
		udp := "udp"
		if i%2 == 1 {
			udp = "udpu"
		}
		pb.check(t, &sc, udp, false)
	}
}
