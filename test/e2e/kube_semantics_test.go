package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/socklane/socklane/internal/service"
	"github.com/socklane/socklane/internal/testbed"
	"github.com/socklane/socklane/internal/testutil"
)

// kubeEndpoint is one endpoint of a test EndpointSlice.
type kubeEndpoint struct {
	ip, node, zone string
	ready          bool
}

// kubeSlice builds an EndpointSlice of service svc whose "http" port is
// port.
func kubeSlice(name, svc string, port int32, eps ...kubeEndpoint) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(port), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for _, e := range eps {
		ep := discoveryv1.Endpoint{Addresses: []string{e.ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(e.ready), Serving: ptr(e.ready), Terminating: ptr(false)}}
		if e.node != "" {
			ep.NodeName = ptr(e.node)
		}
		if e.zone != "" {
			ep.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: e.zone}}}
		}
		es.Endpoints = append(es.Endpoints, ep)
	}
	return es
}

// kubeSvc builds a Service with one TCP port 80, "http", to target.
func kubeSvc(name, clusterIP string, target intstr.IntOrString) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{ClusterIP: clusterIP, Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: target},
		}},
	}
}

// appliedView is `svc list -o json` as far as these tests read it.
type appliedView struct {
	Services []struct {
		service.Service
		Selected map[string]uint64 `json:"selected"`
	} `json:"services"`
	Skipped []service.Skipped `json:"skipped"`
}

func svcView(t *testing.T, lb *lbBed) appliedView {
	t.Helper()
	var v appliedView
	if err := json.Unmarshal([]byte(lb.in.MustRun("svc", "list", "-o", "json")), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestKubeServiceSemantics: kube-proxy's Service semantics for the
// sockets socklane serves, each against a real API server and real
// sockets, judged by where connections land and by the kernel's
// per-backend selection counters: internalTrafficPolicy: Local, topology
// hints with this node's zone label, a named targetPort that differs
// between EndpointSlices, Services left to another proxy (and headless
// and ExternalName ones, listed so), and a readiness flap that keeps the
// flapping endpoint's connections while new ones go elsewhere (an
// endpoint removed still has them destroyed).
func TestKubeServiceSemantics(t *testing.T) {
	api := testutil.StartAPIServer(t)
	lb := newLBBed(t)
	be0, be1 := lb.back[0].IPv4.String(), lb.back[1].IPv4.String()
	start(t, lb.back[1], lb.in.Bin, "peer", "whoami", "[::]:8081", "--network", "tcp", "--label", "be1-8081")
	waitPort(t, lb.back[1], "[::]:8081")
	ctx := context.Background()
	cs := api.Client
	n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{corev1.LabelTopologyZone: "za"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "198.18.250.1"}, {Type: corev1.NodeHostName, Address: "node-1"}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A LoadBalancer Service with an external IP, an ingress IP and a
	// NodePort, externalTrafficPolicy: Local: connections from this
	// node go to every endpoint (kube-proxy's short-circuit for local
	// clients; the policy is for traffic from outside).
	edge := kubeSvc("edge", "198.19.0.25", intstr.FromInt32(8080))
	edge.Spec.Type = corev1.ServiceTypeLoadBalancer
	edge.Spec.Ports[0].NodePort = 30080
	edge.Spec.ExternalIPs = []string{"198.19.1.50"}
	edge.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	edge.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
	if edge, err = cs.CoreV1().Services("default").Create(ctx, edge, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	edge.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.1.51"}}
	if _, err := cs.CoreV1().Services("default").UpdateStatus(ctx, edge, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	local := kubeSvc("local", "198.19.0.20", intstr.FromInt32(8080))
	local.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
	other := kubeSvc("other", "198.19.0.22", intstr.FromInt32(8080))
	other.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": "mesh"}
	headless := kubeSvc("headless", corev1.ClusterIPNone, intstr.FromInt32(8080))
	for _, s := range []*corev1.Service{local, kubeSvc("zoned", "198.19.0.21", intstr.FromInt32(8080)), other, headless,
		kubeSvc("named", "198.19.0.23", intstr.FromString("web")), kubeSvc("flap", "198.19.0.24", intstr.FromInt32(8080))} {
		if _, err := cs.CoreV1().Services("default").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, es := range []*discoveryv1.EndpointSlice{
		kubeSlice("local-1", "local", 8080, kubeEndpoint{ip: be0, node: "node-1", ready: true}, kubeEndpoint{ip: be1, node: "node-2", ready: true}),
		kubeSlice("zoned-1", "zoned", 8080, kubeEndpoint{ip: be0, node: "node-2", zone: "zb", ready: true}, kubeEndpoint{ip: be1, node: "node-3", zone: "za", ready: true}),
		kubeSlice("other-1", "other", 8080, kubeEndpoint{ip: be0, ready: true}),
		// A rolling update renumbering the container port: the old
		// pods' slice says 8080, the new pods' 8081.
		kubeSlice("named-1", "named", 8080, kubeEndpoint{ip: be0, ready: true}),
		kubeSlice("named-2", "named", 8081, kubeEndpoint{ip: be1, ready: true}),
		kubeSlice("flap-1", "flap", 8080, kubeEndpoint{ip: be0, ready: true}, kubeEndpoint{ip: be1, ready: true}),
		kubeSlice("edge-1", "edge", 8080, kubeEndpoint{ip: be0, node: "node-1", ready: true}, kubeEndpoint{ip: be1, node: "node-2", ready: true}),
	} {
		if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var logs lockedBuffer
	startAgent(t, lb, &logs, "--kube-services", "--kubeconfig", api.Kubeconfig, "--node-name", "node-1")
	waitForLog(t, &logs, func() bool {
		v := svcView(t, lb)
		return len(v.Services) == 6 && len(v.Skipped) == 2 // with the API server's own, default/kubernetes
	})
	selected := func(name, backend string) uint64 {
		for _, s := range svcView(t, lb).Services {
			if s.Name == name {
				return s.Selected[backend]
			}
		}
		t.Fatalf("service %s not applied", name)
		return 0
	}

	t.Run("internalTrafficPolicy Local", func(t *testing.T) {
		if r := lb.probe(t, lb.client, "tcp", "198.19.0.20:80", 30); r.Replies["be0"] != 30 {
			t.Errorf("node-1's endpoint is be0: %v %v", r.Replies, r.Errors)
		}
		if n := selected("local", be1+":8080"); n != 0 {
			t.Errorf("the kernel chose node-2's endpoint %d times", n)
		}
	})
	t.Run("topology hints", func(t *testing.T) {
		if r := lb.probe(t, lb.client, "tcp", "198.19.0.21:80", 30); r.Replies["be1"] != 30 {
			t.Errorf("the endpoint hinted for zone za is be1: %v %v", r.Replies, r.Errors)
		}
		if n := selected("zoned", be0+":8080"); n != 0 {
			t.Errorf("the kernel chose zone zb's endpoint %d times", n)
		}
	})
	t.Run("external IPs, load balancer IPs, NodePorts", func(t *testing.T) {
		for _, target := range []string{"198.19.1.50:80", "198.19.1.51:80", "198.18.250.1:30080"} {
			for _, from := range []*testbed.Pod{lb.client, lb.host} {
				r := lb.probe(t, from, "tcp", target, 30)
				if r.Replies["be0"] == 0 || r.Replies["be1"] == 0 || r.Replies["be0"]+r.Replies["be1"] != 30 {
					t.Errorf("%s from %s: want both endpoints (externalTrafficPolicy is for traffic from outside): %v %v", target, from.Name, r.Replies, r.Errors)
				}
			}
		}
		// The cluster IP of the same Service keeps to this node's
		// endpoint (internalTrafficPolicy: Local).
		if r := lb.probe(t, lb.client, "tcp", "198.19.0.25:80", 20); r.Replies["be0"] != 20 {
			t.Errorf("the cluster IP: %v %v", r.Replies, r.Errors)
		}
	})
	t.Run("named target port per slice", func(t *testing.T) {
		r := lb.probe(t, lb.client, "tcp", "198.19.0.23:80", 40)
		if r.Replies["be0"] == 0 || r.Replies["be1-8081"] == 0 || r.Replies["be0"]+r.Replies["be1-8081"] != 40 {
			t.Errorf("want be0 on 8080 and be1 on 8081: %v %v", r.Replies, r.Errors)
		}
	})
	t.Run("left to others", func(t *testing.T) {
		v := svcView(t, lb)
		for _, want := range []string{"default/headless", "default/other"} {
			found := false
			for _, sk := range v.Skipped {
				found = found || sk.Service == want && sk.Ignored
			}
			if !found {
				t.Errorf("%s not listed as left to others: %+v", want, v.Skipped)
			}
		}
		if out := lb.in.MustRun("svc", "list"); !strings.Contains(out, "left to others") || !strings.Contains(out, "service-proxy-name=mesh") {
			t.Errorf("svc list:\n%s", out)
		}
		// Not translated: the ClusterIP is nobody's address here.
		routeVIPsNowhere(t, lb.client)
		if r := lb.probe(t, lb.client, "tcp", "198.19.0.22:80", 1); len(r.Replies) != 0 {
			t.Errorf("another proxy's Service was served: %v", r.Replies)
		}
	})
	t.Run("readiness flap", func(t *testing.T) {
		h := startHold(t, lb.in, lb.client, 16, "--mode", "tcp", "198.19.0.24:80")
		on0 := h.on("be0")
		if len(on0) == 0 || len(h.on("be1")) == 0 {
			t.Fatalf("held sockets not spread: %v", h.backend)
		}
		update := func(eps ...kubeEndpoint) {
			t.Helper()
			if _, err := cs.DiscoveryV1().EndpointSlices("default").Update(ctx, kubeSlice("flap-1", "flap", 8080, eps...), metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		role := func() service.Role {
			for _, s := range svcView(t, lb).Services {
				for _, b := range s.Backends {
					if s.Name == "flap" && b.IP.String() == be0 {
						return b.Role()
					}
				}
			}
			return -1
		}
		update(kubeEndpoint{ip: be0}, kubeEndpoint{ip: be1, ready: true})
		waitForLog(t, &logs, func() bool { return role() == service.RoleIdle })
		if closed := h.closed(t, 0, time.Second); len(closed) != 0 {
			t.Errorf("a readiness flap closed sockets: %v", closed)
		}
		before := selected("flap", be0+":8080")
		if r := lb.probe(t, lb.client, "tcp", "198.19.0.24:80", 20); r.Replies["be1"] != 20 {
			t.Errorf("new connections while be0 is not ready: %v %v", r.Replies, r.Errors)
		}
		// The member stays in the kernel's tables (its counter with it),
		// chosen no more.
		if after := selected("flap", be0+":8080"); after != before || before == 0 {
			t.Errorf("be0's selections %d then %d: want its kernel counter kept and unchanged", before, after)
		}
		update(kubeEndpoint{ip: be0, ready: true}, kubeEndpoint{ip: be1, ready: true})
		waitForLog(t, &logs, func() bool { return role() == service.RoleReady })
		if r := lb.probe(t, lb.client, "tcp", "198.19.0.24:80", 40); r.Replies["be0"] == 0 {
			t.Errorf("be0 ready again takes no connections: %v %v", r.Replies, r.Errors)
		}
		// Gone from the slice: its sockets are destroyed, as before.
		update(kubeEndpoint{ip: be1, ready: true})
		closed := h.closed(t, len(on0), 300*time.Millisecond)
		for _, i := range on0 {
			if closed[i] != "ECONNABORTED" {
				t.Errorf("socket %d on the removed backend: %q, want ECONNABORTED", i, closed[i])
			}
		}
		if len(closed) != len(on0) {
			t.Errorf("%d sockets closed, want the %d on be0", len(closed), len(on0))
		}
	})
}
