package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/socklane/socklane/internal/service"
	"github.com/socklane/socklane/internal/testutil"
)

// kubeService creates a Service on port 80 (target 8080) and its
// endpoints in slices of at most 1,000 (the API server's limit per slice).
func kubeService(t *testing.T, cs kubernetes.Interface, name, clusterIP string, ips []netip.Addr) {
	t.Helper()
	ctx := context.Background()
	if _, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: clusterIP, Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i*1000 < len(ips); i++ {
		es := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", name, i), Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr[int32](8080), Protocol: ptr(corev1.ProtocolTCP)}},
		}
		for _, ip := range ips[i*1000 : min(len(ips), (i+1)*1000)] {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip.String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}})
		}
		if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// fakeEndpoints are n addresses of 198.18.100.0 and above (no pod has them).
func fakeEndpoints(n int) []netip.Addr {
	out := make([]netip.Addr, n)
	for i := range out {
		out[i] = netip.AddrFrom4([4]byte{198, 18, byte(100 + i/250), byte(1 + i%250)})
	}
	return out
}

// TestKubeServiceStandsAlone: a Service that cannot be served (more
// endpoints than a frontend holds) is skipped and reported (log, metric,
// `svc list`), and never holds back the others: a Service of 6,000
// endpoints over six EndpointSlices applies with it, a Service created
// later appears, an endpoint removed later stops receiving connections.
// /readyz answers ready only once the services listed at start are
// programmed.
func TestKubeServiceStandsAlone(t *testing.T) {
	api := testutil.StartAPIServer(t)
	lb := newLBBed(t)
	be0, be1 := lb.back[0], lb.back[1]
	kubeService(t, api.Client, "who", "198.19.0.10", []netip.Addr{be0.IPv4, be1.IPv4})
	kubeService(t, api.Client, "many", "198.19.0.11", fakeEndpoints(6000))
	kubeService(t, api.Client, "huge", "198.19.0.12", fakeEndpoints(service.MaxBackends+500))
	addr := testutil.FreeAddr(t)
	var logs lockedBuffer
	startAgent(t, lb, &logs, "--kube-services", "--kubeconfig", api.Kubeconfig, "--metrics-address", addr)
	base := "http://" + addr
	// The first 200 of /readyz comes after the first full sync.
	deadline := time.Now().Add(time.Minute)
	for {
		code, _, err := httpGet(base + "/readyz")
		if err == nil && code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never ready: %d %v\n%s", code, err, logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	list := lb.in.MustRun("svc", "list")
	for _, want := range []string{"default/who", "default/many"} {
		if !strings.Contains(list, want) {
			t.Fatalf("ready before %s was programmed:\n%s", want, list)
		}
	}
	if !strings.Contains(list, "default/huge: backends:") {
		t.Errorf("svc list does not report the skipped service with its reason:\n%s", list)
	}
	var st struct {
		Skipped []service.Skipped `json:"skipped"`
	}
	if err := json.Unmarshal([]byte(lb.in.MustRun("svc", "list", "-o", "json")), &st); err != nil || len(st.Skipped) != 1 || st.Skipped[0].Service != "default/huge" {
		t.Errorf("svc list -o json skipped: %+v %v", st.Skipped, err)
	}
	if !strings.Contains(logs.String(), "kubernetes service skipped") || !strings.Contains(logs.String(), "service=default/huge") {
		t.Errorf("agent log does not name the skipped service:\n%s", logs.String())
	}
	_, body, err := httpGet(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, err := testutil.ParseMetrics(body)
	if err != nil {
		t.Fatal(err)
	}
	if m[`socklane_service_skipped,service=default/huge`] != 1 {
		t.Errorf("socklane_service_skipped{service=default/huge} missing")
	}
	// The programming latency of each apply, from the API event.
	if m[`socklane_service_programming_seconds_count`] < 1 || m[`socklane_service_programming_seconds_sum`] <= 0 {
		t.Errorf("socklane_service_programming_seconds: count %v sum %v, want the applies observed",
			m[`socklane_service_programming_seconds_count`], m[`socklane_service_programming_seconds_sum`])
	}
	var many struct {
		Services []struct {
			Backends []service.Backend `json:"backends"`
		} `json:"services"`
	}
	if err := json.Unmarshal([]byte(lb.in.MustRun("svc", "get", "many", "-o", "json")), &many); err != nil || len(many.Services) != 1 || len(many.Services[0].Backends) != 6000 {
		t.Errorf("many: want one service with 6000 backends (%v)", err)
	}
	if r := lb.probe(t, lb.client, "tcp", "198.19.0.10:80", 20); r.Replies["be0"]+r.Replies["be1"] != 20 {
		t.Fatalf("through who's ClusterIP: %v %v", r.Replies, r.Errors)
	}

	// Later changes still apply with the skipped service in place.
	kubeService(t, api.Client, "later", "198.19.0.13", []netip.Addr{be0.IPv4})
	waitForLog(t, &logs, func() bool { return strings.Contains(lb.in.MustRun("svc", "list"), "default/later") })
	if r := lb.probe(t, lb.client, "tcp", "198.19.0.13:80", 5); r.Replies["be0"] != 5 {
		t.Errorf("through later's ClusterIP: %v %v", r.Replies, r.Errors)
	}
	es, err := api.Client.DiscoveryV1().EndpointSlices("default").Get(context.Background(), "who-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es.Endpoints = es.Endpoints[1:] // be0 leaves
	if _, err := api.Client.DiscoveryV1().EndpointSlices("default").Update(context.Background(), es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForLog(t, &logs, func() bool {
		out := lb.in.MustRun("svc", "get", "who")
		return !strings.Contains(out, be0.IPv4.String()+"(")
	})
	if r := lb.probe(t, lb.client, "tcp", "198.19.0.10:80", 20); r.Replies["be1"] != 20 {
		t.Errorf("after be0 left who: %v %v", r.Replies, r.Errors)
	}
}
