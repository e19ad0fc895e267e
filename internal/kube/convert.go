// Package kube is socklane's Kubernetes API source: it watches Services
// and EndpointSlices with client-go informers and turns them into the
// service model the load balancer serves, the same model as a YAML file.
package kube

import (
	"fmt"
	"net/netip"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/socklane/socklane/internal/service"
)

// Build turns Services and their EndpointSlices into services. Headless
// and ExternalName services have no virtual IP and are left out, as are
// SCTP ports. It returns what it had to leave out, for the log.
func Build(svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice) ([]*service.Service, []string) {
	bySvc := map[string][]*discoveryv1.EndpointSlice{}
	for _, es := range slices {
		name := es.Labels[discoveryv1.LabelServiceName]
		if name == "" {
			continue
		}
		bySvc[es.Namespace+"/"+name] = append(bySvc[es.Namespace+"/"+name], es)
	}
	var out []*service.Service
	var notes []string
	for _, k := range svcs {
		if k.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		s := &service.Service{Name: k.Name, Namespace: k.Namespace, Affinity: service.AffinityNone}
		for _, ip := range k.Spec.ClusterIPs {
			if ip == "" || ip == corev1.ClusterIPNone {
				continue
			}
			a, err := netip.ParseAddr(ip)
			if err != nil {
				notes = append(notes, fmt.Sprintf("%s/%s: cluster IP %q: %v", k.Namespace, k.Name, ip, err))
				continue
			}
			s.VIPs = append(s.VIPs, a)
		}
		if len(s.VIPs) == 0 {
			continue // headless
		}
		if k.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
			s.Affinity = service.AffinityClientIP
			s.Timeout = service.DefaultAffinityTimeout
			if c := k.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
				s.Timeout = time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
			}
		}
		eps := bySvc[k.Namespace+"/"+k.Name]
		sort.Slice(eps, func(i, j int) bool { return eps[i].Name < eps[j].Name })
		for _, p := range k.Spec.Ports {
			proto := service.TCP
			switch p.Protocol {
			case corev1.ProtocolUDP:
				proto = service.UDP
			case corev1.ProtocolSCTP:
				notes = append(notes, fmt.Sprintf("%s/%s: port %s: SCTP is not balanced", k.Namespace, k.Name, p.Name))
				continue
			}
			sp := service.Port{Name: p.Name, Port: uint16(p.Port), Protocol: proto, TargetPort: targetPort(p, eps)}
			if sp.TargetPort == 0 {
				notes = append(notes, fmt.Sprintf("%s/%s: port %s: no endpoint port yet", k.Namespace, k.Name, p.Name))
				sp.TargetPort = uint16(p.Port)
			}
			s.Ports = append(s.Ports, sp)
		}
		if len(s.Ports) == 0 {
			continue
		}
		s.Backends = backends(eps, s.VIPs)
		out = append(out, s)
	}
	return out, notes
}

// targetPort is the endpoint port named like the service port (Kubernetes
// resolves named target ports per pod; socklane takes the first slice's).
func targetPort(p corev1.ServicePort, eps []*discoveryv1.EndpointSlice) uint16 {
	for _, es := range eps {
		for _, ep := range es.Ports {
			name := ""
			if ep.Name != nil {
				name = *ep.Name
			}
			proto := corev1.ProtocolTCP
			if ep.Protocol != nil {
				proto = *ep.Protocol
			}
			if name == p.Name && proto == p.Protocol && ep.Port != nil {
				return uint16(*ep.Port)
			}
		}
	}
	if p.TargetPort.IntValue() > 0 {
		return uint16(p.TargetPort.IntValue())
	}
	return 0
}

// backends are the slices' endpoints of the VIPs' families, once each:
// ready ones, and terminating ones that still serve (Kubernetes' rule:
// used only when none is ready). Endpoints neither ready nor serving are
// left out.
func backends(eps []*discoveryv1.EndpointSlice, vips []netip.Addr) []service.Backend {
	fam := map[bool]bool{}
	for _, v := range vips {
		fam[v.Is4()] = true
	}
	seen := map[netip.Addr]bool{}
	var out []service.Backend
	for _, es := range eps {
		if es.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		for _, e := range es.Endpoints {
			ready := e.Conditions.Ready == nil || *e.Conditions.Ready
			serving := e.Conditions.Serving == nil && ready || e.Conditions.Serving != nil && *e.Conditions.Serving
			terminating := e.Conditions.Terminating != nil && *e.Conditions.Terminating
			if usable := ready || serving && terminating; !usable {
				continue
			}
			for _, a := range e.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil || !fam[ip.Is4()] || seen[ip] {
					continue
				}
				seen[ip] = true
				r := ready && !terminating
				out = append(out, service.Backend{IP: ip, Ready: &r, Terminating: terminating})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].IP.Less(out[j].IP) })
	return out
}
