package kube

import (
	"cmp"
	"maps"
	"net/netip"
	goslices "slices"
	"strings"
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
	out, ignored, notes := Build(svcs, slices, Node{Name: "n1"})
	if len(out) != 2 {
		t.Fatalf("%d services, want web and empty: %+v", len(out), out)
	}
	if len(ignored) != 2 || ignored[0].Service != "shop/headless" || !strings.Contains(ignored[0].Reason, "headless") ||
		ignored[1].Service != "shop/external" || !strings.Contains(ignored[1].Reason, "ExternalName") || !ignored[0].Ignored {
		t.Errorf("ignored %+v, want headless and external, said so", ignored)
	}
	w := out[0]
	if w.Key() != "shop/web" || w.Affinity != service.AffinityClientIP || w.Timeout != time.Minute {
		t.Errorf("web: %+v", w)
	}
	if len(w.Ports) != 2 || w.Ports[0].TargetPort != 8080 || w.Ports[1].Protocol != service.UDP || w.Ports[1].TargetPort != 5353 {
		t.Errorf("web ports %+v", w.Ports)
	}
	roles := func(bs []service.Backend) []service.Role {
		var out []service.Role
		for _, b := range bs {
			out = append(out, b.Role())
		}
		return out
	}
	// The endpoint that is not ready stays a member, chosen by nobody.
	if got := roles(w.Backends); !goslices.Equal(got, []service.Role{service.RoleReady, service.RoleFallback, service.RoleIdle}) {
		t.Errorf("web backends %+v: roles %v", w.Backends, got)
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

// TestBuildSemantics: kube-proxy's choices, one Service at a time.
func TestBuildSemantics(t *testing.T) {
	http := []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr[int32](8080), Protocol: ptr(corev1.ProtocolTCP)}}
	on := func(e discoveryv1.Endpoint, node string, zones ...string) discoveryv1.Endpoint {
		e.NodeName = &node
		if len(zones) > 0 {
			e.Hints = &discoveryv1.EndpointHints{}
			for _, z := range zones {
				if strings.HasPrefix(z, "node:") {
					e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: strings.TrimPrefix(z, "node:")})
				} else {
					e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
				}
			}
		}
		return e
	}
	ready := func(ip string) discoveryv1.Endpoint { return endpoint(ip, true, true, false) }
	local := corev1.ServiceInternalTrafficPolicyLocal
	type want struct {
		roles     map[string]service.Role // by backend IP; absent: no member
		ports     map[string]uint16       // by backend IP: its http port
		choice    string
		ignored   string
		frontends []string // all of them, when given
		selection service.Selection
	}
	for _, tc := range []struct {
		name   string
		edit   func(*corev1.Service)
		slices []*discoveryv1.EndpointSlice
		node   Node
		want   want
	}{
		{"cluster policy: every ready endpoint", nil,
			[]*discoveryv1.EndpointSlice{slice("s", "s-a", http, on(ready("198.18.0.1"), "n1"), on(ready("198.18.0.2"), "n2"))},
			Node{Name: "n1"}, want{roles: map[string]service.Role{"198.18.0.1": service.RoleReady, "198.18.0.2": service.RoleReady}}},
		{"internalTrafficPolicy Local: this node's only", func(s *corev1.Service) { s.Spec.InternalTrafficPolicy = &local },
			[]*discoveryv1.EndpointSlice{slice("s", "s-a", http, on(ready("198.18.0.1"), "n1"), on(ready("198.18.0.2"), "n2"))},
			Node{Name: "n1"}, want{roles: map[string]service.Role{"198.18.0.1": service.RoleReady, "198.18.0.2": service.RoleIdle}, choice: "internalTrafficPolicy"}},
		{"internalTrafficPolicy Local without local endpoints: none", func(s *corev1.Service) { s.Spec.InternalTrafficPolicy = &local },
			[]*discoveryv1.EndpointSlice{slice("s", "s-a", http, on(ready("198.18.0.2"), "n2"))},
			Node{Name: "n1"}, want{roles: map[string]service.Role{"198.18.0.2": service.RoleIdle}, choice: "internalTrafficPolicy"}},
		{"internalTrafficPolicy Local: a local terminating endpoint is the fallback, a remote one is not", func(s *corev1.Service) { s.Spec.InternalTrafficPolicy = &local },
			[]*discoveryv1.EndpointSlice{slice("s", "s-a", http, on(endpoint("198.18.0.1", false, true, true), "n1"), on(endpoint("198.18.0.2", false, true, true), "n2"))},
			Node{Name: "n1"}, want{roles: map[string]service.Role{"198.18.0.1": service.RoleFallback, "198.18.0.2": service.RoleIdle}, choice: "internalTrafficPolicy"}},
		{"zone hints for this zone", nil,
			[]*discoveryv1.EndpointSlice{slice("s", "s-a", http, on(ready("198.18.0.1"), "n1", "za"), on(ready("198.18.0.2"), "n2", "zb"))},
			Node{Name: "n1", Zone: "za"}, want{roles: map[string]service.Role{"198.18.0.1": service.RoleReady, "198.18.0.2": service.RoleIdle}, choice: "zone za"}},
		{"zone hints, none for this zone: every endpoint", nil,
			[]*discoveryv1.EndpointSlice{slice("s", "s-a", http, on(ready("198.18.0.1"), "n1", "zb"), on(ready("198.18.0.2"), "n2", "zb"))},
			Node{Name: "n1", Zone: "za"}, want{roles: map[string]service.Role{"198.18.0.1": service.RoleReady, "198.18.0.2": service.RoleReady}}},
		{"a ready endpoint without hints: hints not used", nil,
			[]*discoveryv1.EndpointSlice{slice("s", "s-a", http, on(ready("198.18.0.1"), "n1", "za"), on(ready("198.18.0.2"), "n2"))},
			Node{Name: "n1", Zone: "za"}, want{roles: map[string]service.Role{"198.18.0.1": service.RoleReady, "198.18.0.2": service.RoleReady}}},
		{"node unknown: zone hints not used", nil,
			[]*discoveryv1.EndpointSlice{slice("s", "s-a", http, on(ready("198.18.0.1"), "n1", "za"), on(ready("198.18.0.2"), "n2", "zb"))},
			Node{Name: "n1"}, want{roles: map[string]service.Role{"198.18.0.1": service.RoleReady, "198.18.0.2": service.RoleReady}}},
		{"node hints before zone hints", nil,
			[]*discoveryv1.EndpointSlice{slice("s", "s-a", http, on(ready("198.18.0.1"), "n1", "za", "node:n1"), on(ready("198.18.0.2"), "n2", "za", "node:n2"))},
			Node{Name: "n1", Zone: "za"}, want{roles: map[string]service.Role{"198.18.0.1": service.RoleReady, "198.18.0.2": service.RoleIdle}, choice: "node n1"}},
		{"hints: terminating endpoints are the fallback in any zone", nil,
			[]*discoveryv1.EndpointSlice{slice("s", "s-a", http, on(endpoint("198.18.0.1", false, true, true), "n1", "zb"), on(endpoint("198.18.0.2", false, false, true), "n2", "za"))},
			Node{Name: "n1", Zone: "za"}, want{roles: map[string]service.Role{"198.18.0.1": service.RoleFallback}}},
		{"terminating and not serving: no member", nil,
			[]*discoveryv1.EndpointSlice{slice("s", "s-a", http, ready("198.18.0.1"), endpoint("198.18.0.2", false, false, true), endpoint("198.18.0.3", false, false, false))},
			Node{}, want{roles: map[string]service.Role{"198.18.0.1": service.RoleReady, "198.18.0.3": service.RoleIdle}}},
		{"named target port resolved per slice", func(s *corev1.Service) { s.Spec.Ports[0].TargetPort = intstr.FromString("web") },
			[]*discoveryv1.EndpointSlice{
				slice("s", "s-a", http, ready("198.18.0.1")),
				slice("s", "s-b", []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr[int32](9090), Protocol: ptr(corev1.ProtocolTCP)}}, ready("198.18.0.2")),
				slice("s", "s-c", []discoveryv1.EndpointPort{{Name: ptr("other"), Port: ptr[int32](7070), Protocol: ptr(corev1.ProtocolTCP)}}, ready("198.18.0.3")),
			},
			Node{}, want{roles: map[string]service.Role{"198.18.0.1": service.RoleReady, "198.18.0.2": service.RoleReady, "198.18.0.3": service.RoleReady},
				ports: map[string]uint16{"198.18.0.1": 8080, "198.18.0.2": 9090}}},
		{"LoadBalancer: external IPs, ingress IPs, NodePorts; internalTrafficPolicy only at the cluster IP", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.InternalTrafficPolicy = &local
			s.Spec.Ports[0].NodePort = 30080
			s.Spec.ExternalIPs = []string{"198.19.9.1", "2001:db8::9", "bad"}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.9.2"}, {IP: "198.19.9.3", IPMode: ptr(corev1.LoadBalancerIPModeProxy)}}
		},
			[]*discoveryv1.EndpointSlice{slice("s", "s-a", http, on(ready("198.18.0.1"), "n1"), on(ready("198.18.0.2"), "n2"))},
			Node{Name: "n1", Addrs: []netip.Addr{netip.MustParseAddr("198.18.250.1"), netip.MustParseAddr("2001:db8::1")}},
			want{roles: map[string]service.Role{"198.18.0.1": service.RoleReady, "198.18.0.2": service.RoleIdle}, choice: "internalTrafficPolicy",
				frontends: []string{"198.19.0.1:80/TCP", "198.19.9.1:80/TCP", "198.19.9.2:80/TCP", "198.18.250.1:30080/TCP"}}},
		{"Maglev by annotation", func(s *corev1.Service) { s.Annotations = map[string]string{SelectionAnnotation: "Maglev"} },
			[]*discoveryv1.EndpointSlice{slice("s", "s-a", http, ready("198.18.0.1"))},
			Node{}, want{roles: map[string]service.Role{"198.18.0.1": service.RoleReady}, selection: service.SelectMaglev}},
		{"another proxy's", func(s *corev1.Service) { s.Labels = map[string]string{ProxyNameLabel: "mesh"} },
			[]*discoveryv1.EndpointSlice{slice("s", "s-a", http, ready("198.18.0.1"))},
			Node{}, want{ignored: "another proxy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := svc("s", []string{"198.19.0.1"}, corev1.ServiceTypeClusterIP, corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)})
			if tc.edit != nil {
				tc.edit(k)
			}
			out, ignored, _ := Build([]*corev1.Service{k}, tc.slices, tc.node)
			if tc.want.ignored != "" {
				if len(out) != 0 || len(ignored) != 1 || !strings.Contains(ignored[0].Reason, tc.want.ignored) {
					t.Fatalf("served %+v, ignored %+v; want it ignored for %q", out, ignored, tc.want.ignored)
				}
				return
			}
			if len(out) != 1 || len(ignored) != 0 {
				t.Fatalf("served %+v, ignored %+v", out, ignored)
			}
			s := out[0]
			got := map[string]service.Role{}
			for _, b := range s.Backends {
				got[b.IP.String()] = s.RoleAt(b, s.Bindings()[0]) // the cluster IP's
				if n, ok := tc.want.ports[b.IP.String()]; ok {
					if p, serves := b.TargetPort(s.Ports[0]); !serves || p != n {
						t.Errorf("%s serves http on %d (%v), want %d", b.IP, p, serves, n)
					}
				} else if tc.want.ports != nil {
					if _, serves := b.TargetPort(s.Ports[0]); serves {
						t.Errorf("%s serves http, but its slice has no such port", b.IP)
					}
				}
			}
			if tc.want.frontends != nil {
				var fs []string
				for _, f := range s.Frontends() {
					fs = append(fs, f.String())
				}
				if !goslices.Equal(fs, tc.want.frontends) {
					t.Errorf("frontends %v, want %v", fs, tc.want.frontends)
				}
				// Connections from this node to the external
				// addresses go to any endpoint.
				for _, at := range s.Bindings()[1:] {
					for _, b := range s.Backends {
						if r := s.RoleAt(b, at); r != service.RoleReady {
							t.Errorf("%s at %s: role %v, want ready", b.IP, at.Frontend, r)
						}
					}
				}
			}
			if !maps.Equal(got, tc.want.roles) {
				t.Errorf("roles %v, want %v", got, tc.want.roles)
			}
			if !strings.Contains(s.Choice, tc.want.choice) || tc.want.choice == "" && s.Choice != "" {
				t.Errorf("choice %q, want %q", s.Choice, tc.want.choice)
			}
			if _, err := service.NewSet(out); err != nil {
				t.Errorf("the built service does not validate: %v", err)
			}
			if want := cmp.Or(tc.want.selection, service.SelectRandom); s.Selection != want {
				t.Errorf("selection %q, want %q", s.Selection, want)
			}
		})
	}
}
