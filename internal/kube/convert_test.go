package kube

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/socklane/socklane/internal/service"
)

func ptr[T any](v T) *T { return &v }

func svc(name string, ips []string, typ corev1.ServiceType, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop"},
		Spec:       corev1.ServiceSpec{Type: typ, ClusterIPs: ips, Ports: ports},
	}
}

func endpoint(ip string, ready, serving, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating}}
}

func slice(svcName, name string, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       ports,
		Endpoints:   eps,
	}
}

func TestBuild(t *testing.T) {
	web := svc("web", []string{"198.19.1.10"}, corev1.ServiceTypeClusterIP,
		corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("web")},
		corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(5353)},
		corev1.ServicePort{Name: "sctp", Port: 9, Protocol: corev1.ProtocolSCTP})
	web.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	web.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr[int32](60)}}
	svcs := []*corev1.Service{
		web,
		svc("headless", []string{"None"}, corev1.ServiceTypeClusterIP, corev1.ServicePort{Name: "x", Port: 1}),
		svc("external", nil, corev1.ServiceTypeExternalName, corev1.ServicePort{Name: "x", Port: 1}),
		svc("empty", []string{"198.19.1.11"}, corev1.ServiceTypeClusterIP, corev1.ServicePort{Name: "x", Port: 81, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8081)}),
	}
	slices := []*discoveryv1.EndpointSlice{
		slice("web", "web-a", []discoveryv1.EndpointPort{
			{Name: ptr("http"), Port: ptr[int32](8080), Protocol: ptr(corev1.ProtocolTCP)},
			{Name: ptr("dns"), Port: ptr[int32](5353), Protocol: ptr(corev1.ProtocolUDP)},
		},
			endpoint("198.18.5.2", true, true, false),
			endpoint("198.18.5.3", false, true, true),   // terminating, still serving
			endpoint("198.18.5.4", false, false, false), // not ready: left out
		),
		slice("web", "web-b", nil, endpoint("198.18.5.2", true, true, false)), // a duplicate
	}
	out, notes := Build(svcs, slices)
	if len(out) != 2 {
		t.Fatalf("%d services, want web and empty: %+v", len(out), out)
	}
	w := out[0]
	if w.Key() != "shop/web" || w.Affinity != service.AffinityClientIP || w.Timeout != time.Minute {
		t.Errorf("web: %+v", w)
	}
	if len(w.Ports) != 2 || w.Ports[0].TargetPort != 8080 || w.Ports[1].Protocol != service.UDP || w.Ports[1].TargetPort != 5353 {
		t.Errorf("web ports %+v", w.Ports)
	}
	if len(w.Backends) != 2 || !w.Backends[0].IsReady() || w.Backends[1].IsReady() || !w.Backends[1].Terminating {
		t.Errorf("web backends %+v", w.Backends)
	}
	if e := out[1]; e.Name != "empty" || len(e.Backends) != 0 || e.Ports[0].TargetPort != 8081 {
		t.Errorf("empty: %+v", e)
	}
	if len(notes) == 0 {
		t.Errorf("no note about the SCTP port")
	}
	if _, err := service.NewSet(out); err != nil {
		t.Errorf("the built services do not validate: %v", err)
	}
}
