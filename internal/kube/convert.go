// Package kube is socklane's Kubernetes API source: it watches Services
// and EndpointSlices with client-go informers and turns them into the
// service model the load balancer serves, the same model as a YAML file.
package kube

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/socklane/socklane/internal/service"
)

// ProxyNameLabel on a Service hands it to another proxy: kube-proxy
// (and socklane) leave it alone.
const ProxyNameLabel = "service.kubernetes.io/service-proxy-name"

// SelectionAnnotation on a Service chooses how its backends are picked:
// Random (the default) or Maglev (service.Selection).
const SelectionAnnotation = "socklane.io/selection"

// Node is what Build needs of the node it serves: its name (an
// endpoint's nodeName says whether it is local) and its zone (the
// topology.kubernetes.io/zone label, for topology hints).
type Node struct {
	Name, Zone string
	// Addrs are the node's addresses (status.addresses: InternalIP and
	// ExternalIP), where NodePorts are served.
	Addrs []netip.Addr
}

// Build turns Services and their EndpointSlices into services, with
// kube-proxy's semantics for the sockets of node:
//   - a Service labelled service.kubernetes.io/service-proxy-name, a
//     headless one and an ExternalName one are not served (ignored, and
//     said so), nor are SCTP ports;
//   - a named targetPort is resolved per EndpointSlice, so endpoints of
//     one Service may listen on different numbers;
//   - internalTrafficPolicy: Local takes new connections only to this
//     node's endpoints (none: refused);
//   - topology hints (hints.forNodes, then hints.forZones) narrow new
//     connections to this node's or zone's endpoints when every ready
//     endpoint has hints and one is for here (kube-proxy's rule);
//   - endpoints not chosen for new connections (not ready, another
//     node's or zone's) stay members: their established connections are
//     left alone. Only an endpoint gone from the slices, or terminating
//     and no longer serving, is no member.
//
// It returns the services, those it ignores with why, and notes for the
// log.
func Build(svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice, node Node) ([]*service.Service, []service.Skipped, []string) {
	bySvc := map[string][]*discoveryv1.EndpointSlice{}
	for _, es := range slices {
		name := es.Labels[discoveryv1.LabelServiceName]
		if name == "" {
			continue
		}
		bySvc[es.Namespace+"/"+name] = append(bySvc[es.Namespace+"/"+name], es)
	}
	var out []*service.Service
	var ignored []service.Skipped
	var notes []string
	for _, k := range svcs {
		s, ig, n := buildOne(k, bySvc[k.Namespace+"/"+k.Name], node)
		notes = append(notes, n...)
		switch {
		case ig != nil:
			ignored = append(ignored, *ig)
		case s != nil:
			out = append(out, s)
		}
	}
	return out, ignored, notes
}

// buildOne is Build for one Service and its EndpointSlices: the service,
// or why it is ignored, or neither (no port to serve).
func buildOne(k *corev1.Service, eps []*discoveryv1.EndpointSlice, node Node) (*service.Service, *service.Skipped, []string) {
	var notes []string
	ignore := func(why string) (*service.Service, *service.Skipped, []string) {
		return nil, &service.Skipped{Service: k.Namespace + "/" + k.Name, Reason: why, Ignored: true}, notes
	}
	if p, ok := k.Labels[ProxyNameLabel]; ok {
		return ignore(fmt.Sprintf("label %s=%s: another proxy serves it", ProxyNameLabel, p))
	}
	if k.Spec.Type == corev1.ServiceTypeExternalName {
		return ignore("ExternalName: a DNS alias, no virtual IP")
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
		return ignore("headless: no cluster IP (DNS names the endpoints)")
	}
	if sel := k.Annotations[SelectionAnnotation]; sel != "" {
		s.Selection = service.Selection(sel)
	}
	if k.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		s.Affinity = service.AffinityClientIP
		s.Timeout = service.DefaultAffinityTimeout
		if c := k.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			s.Timeout = time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
		}
	}
	eps = slices.Clone(eps)
	sort.Slice(eps, func(i, j int) bool { return eps[i].Name < eps[j].Name })
	var kports []corev1.ServicePort
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
		if k.Spec.Type == corev1.ServiceTypeNodePort || k.Spec.Type == corev1.ServiceTypeLoadBalancer {
			sp.NodePort = uint16(p.NodePort)
		}
		if sp.TargetPort == 0 {
			notes = append(notes, fmt.Sprintf("%s/%s: port %s: no endpoint port yet", k.Namespace, k.Name, p.Name))
			sp.TargetPort = uint16(p.Port)
		}
		s.Ports = append(s.Ports, sp)
		kports = append(kports, p)
	}
	if len(s.Ports) == 0 {
		return nil, nil, notes
	}
	local := k.Spec.InternalTrafficPolicy != nil && *k.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	if local {
		s.InternalTrafficPolicy = "Local"
	}
	s.Backends, s.Choice = backends(eps, s.VIPs, kports, node, local)
	s.ExternalIPs, s.NodeAddrs = external(k, s.VIPs, node)
	return s, nil, notes
}

// targetPort is the port of the first slice (by name) that has the
// service port's: what `svc list` shows. Each backend carries its own.
func targetPort(p corev1.ServicePort, eps []*discoveryv1.EndpointSlice) uint16 {
	for _, es := range eps {
		if n, ok := slicePort(p, es); ok {
			return n
		}
	}
	if p.TargetPort.IntValue() > 0 {
		return uint16(p.TargetPort.IntValue())
	}
	return 0
}

// slicePort is the slice's port for service port p: the one of the same
// name and protocol (the EndpointSlice controller names them so).
func slicePort(p corev1.ServicePort, es *discoveryv1.EndpointSlice) (uint16, bool) {
	for _, ep := range es.Ports {
		name := ""
		if ep.Name != nil {
			name = *ep.Name
		}
		proto := corev1.ProtocolTCP
		if ep.Protocol != nil {
			proto = *ep.Protocol
		}
		if name == p.Name && proto == p.Protocol && ep.Port != nil && *ep.Port > 0 && *ep.Port < 65536 {
			return uint16(*ep.Port), true
		}
	}
	return 0, false
}

// candidate is one endpoint address with what kube-proxy judges it by.
type candidate struct {
	be                          service.Backend
	ready, serving, terminating bool
	nodeName                    string
	nodeHints, zoneHints        map[string]bool
}

// backends are the slices' endpoints of the VIPs' families, once each
// (the first slice by name wins), with their roles for new connections
// from node, and a description of the choice made (for `svc list`).
func backends(eps []*discoveryv1.EndpointSlice, vips []netip.Addr, ports []corev1.ServicePort, node Node, local bool) ([]service.Backend, string) {
	fam := map[bool]bool{}
	for _, v := range vips {
		fam[v.Is4()] = true
	}
	seen := map[netip.Addr]bool{}
	var cands []*candidate
	for _, es := range eps {
		if es.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		pm := map[string]uint16{}
		for _, p := range ports {
			if n, ok := slicePort(p, es); ok {
				pm[p.Name] = n
			} else if p.TargetPort.Type == 0 && p.TargetPort.IntValue() > 0 && len(es.Ports) == 0 {
				// A slice without ports (a selector-less Service's
				// hand-made slice): the numeric targetPort.
				pm[p.Name] = uint16(p.TargetPort.IntValue())
			}
		}
		for _, e := range es.Endpoints {
			c := &candidate{
				ready:       e.Conditions.Ready == nil || *e.Conditions.Ready,
				terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
			}
			c.serving = e.Conditions.Serving == nil && c.ready || e.Conditions.Serving != nil && *e.Conditions.Serving
			if c.terminating && !c.serving {
				continue // gone for good: its connections go too
			}
			if e.NodeName != nil {
				c.nodeName = *e.NodeName
			}
			if e.Hints != nil {
				c.nodeHints, c.zoneHints = map[string]bool{}, map[string]bool{}
				for _, h := range e.Hints.ForNodes {
					c.nodeHints[h.Name] = true
				}
				for _, h := range e.Hints.ForZones {
					c.zoneHints[h.Name] = true
				}
			}
			for _, a := range e.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil || !fam[ip.Is4()] || seen[ip] {
					continue
				}
				seen[ip] = true
				cc := *c
				ready := c.ready && !c.terminating
				cc.be = service.Backend{IP: ip, Ready: &ready, Terminating: c.terminating, Ports: pm}
				cands = append(cands, &cc)
			}
		}
	}
	for _, c := range cands {
		c.be.Remote = node.Name == "" || c.nodeName != node.Name
	}
	choice := ""
	switch {
	case local:
		choice = "this node's endpoints at the cluster IPs (internalTrafficPolicy: Local)"
	default:
		if by, key := topology(cands, node); by != "" {
			choice = by + " " + key + "'s endpoints (topology hints)"
			for _, c := range cands {
				hints := c.zoneHints
				if by == "node" {
					hints = c.nodeHints
				}
				// Terminating endpoints are the fallback when none
				// is ready, whatever their hints (kube-proxy's rule).
				if c.be.Role() == service.RoleReady && !hints[key] {
					c.be.Excluded = "hinted for elsewhere (topology)"
				}
			}
		}
	}
	out := make([]service.Backend, 0, len(cands))
	for _, c := range cands {
		out = append(out, c.be)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].IP.Less(out[j].IP) })
	return out, choice
}

// topology is kube-proxy's use of hints: this node's when every ready
// endpoint has node hints and one is for this node, else this zone's
// when every ready endpoint has zone hints and one is for this zone;
// else none ("").
func topology(cands []*candidate, node Node) (by, key string) {
	allNode, forNode, allZone, forZone, any := true, false, true, false, false
	for _, c := range cands {
		if c.be.Role() != service.RoleReady {
			continue
		}
		any = true
		if len(c.nodeHints) == 0 {
			allNode = false
		} else if node.Name != "" && c.nodeHints[node.Name] {
			forNode = true
		}
		if len(c.zoneHints) == 0 {
			allZone = false
		} else if node.Zone != "" && c.zoneHints[node.Zone] {
			forZone = true
		}
	}
	switch {
	case !any:
		return "", ""
	case allNode && forNode:
		return "node", node.Name
	case allZone && forZone:
		return "zone", node.Zone
	}
	return "", ""
}

// external are the addresses beyond the cluster IPs where the service's
// ports are served for this node's sockets, of the cluster IPs'
// families: its externalIPs and load balancer ingress IPs (but those
// whose ipMode is Proxy: traffic to them goes through the load
// balancer), and the node's addresses for its NodePorts.
func external(k *corev1.Service, vips []netip.Addr, node Node) (ips, nodeAddrs []netip.Addr) {
	fam := map[bool]bool{}
	for _, v := range vips {
		fam[v.Is4()] = true
	}
	seen := map[netip.Addr]bool{}
	add := func(s string) {
		a, err := netip.ParseAddr(s)
		if err != nil || !fam[a.Is4()] || seen[a] || a.IsLoopback() || a.IsUnspecified() || a.IsMulticast() {
			return
		}
		seen[a] = true
		ips = append(ips, a)
	}
	for _, ip := range k.Spec.ExternalIPs {
		add(ip)
	}
	if k.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, in := range k.Status.LoadBalancer.Ingress {
			if in.IPMode != nil && *in.IPMode == corev1.LoadBalancerIPModeProxy {
				continue
			}
			add(in.IP)
		}
	}
	if k.Spec.Type == corev1.ServiceTypeNodePort || k.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, a := range node.Addrs {
			if fam[a.Is4()] {
				nodeAddrs = append(nodeAddrs, a)
			}
		}
	}
	return ips, nodeAddrs
}
