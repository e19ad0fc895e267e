// Package service is socklane's model of cluster services: virtual IPs and
// ports with their backends, as Kubernetes Services and EndpointSlices
// describe them. It is independent of where services come from (a YAML file
// today, the API server later) and of how the datapath stores them.
package service

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/socklane/socklane/internal/yamlsrc"
)

// Protocol of a service port.
type Protocol string

// Protocols a service port may use.
const (
	TCP Protocol = "TCP"
	UDP Protocol = "UDP"
)

// Number is the protocol's IP protocol number (IPPROTO_TCP, IPPROTO_UDP).
func (p Protocol) Number() uint8 {
	if p == UDP {
		return 17
	}
	return 6
}

// ProtocolOf is the protocol of an IP protocol number as the datapath
// records it (Number's inverse; anything but UDP is TCP).
func ProtocolOf(n uint8) Protocol {
	if n == 17 {
		return UDP
	}
	return TCP
}

// Affinity is Kubernetes' sessionAffinity.
type Affinity string

// Session affinity kinds.
const (
	AffinityNone     Affinity = "None"
	AffinityClientIP Affinity = "ClientIP"
)

// DefaultAffinityTimeout is Kubernetes' default sessionAffinityConfig
// clientIP.timeoutSeconds (3 hours).
const DefaultAffinityTimeout = 3 * time.Hour

// MaxBackends bounds one service's backends (ready and terminating).
// Kubernetes sets no such limit (a Service's endpoints span as many
// EndpointSlices as it needs); this one keeps a frontend's backends within
// one bank of the datapath's backend table, well above what kube-proxy is
// tested with (5,000 endpoints per Service).
const MaxBackends = 16384

// Port is one port of a service.
type Port struct {
	Name       string   `yaml:"name,omitempty" json:"name,omitempty"`
	Port       uint16   `yaml:"port" json:"port"`
	Protocol   Protocol `yaml:"protocol,omitempty" json:"protocol"`
	TargetPort uint16   `yaml:"targetPort,omitempty" json:"targetPort"`
	// NodePort, when set, is served on each of the service's
	// NodeAddrs too.
	NodePort uint16 `yaml:"nodePort,omitempty" json:"nodePort,omitempty"`
}

// Backend is one endpoint of a service. Kubernetes' rule: terminating
// endpoints receive new connections only when no endpoint is ready.
type Backend struct {
	IP          netip.Addr `yaml:"ip" json:"ip"`
	Ready       *bool      `yaml:"ready,omitempty" json:"ready,omitempty"`
	Terminating bool       `yaml:"terminating,omitempty" json:"terminating,omitempty"`
	// Ports, when set, is the backend's own port for each service port
	// (by the service port's name): Kubernetes resolves a named
	// targetPort per endpoint, so a rolling update may renumber it. A
	// service port missing here is not served by this backend. Unset:
	// every port's TargetPort.
	Ports map[string]uint16 `yaml:"ports,omitempty" json:"ports,omitempty"`
	// Remote: the endpoint is on another node (internalTrafficPolicy:
	// Local keeps its service's cluster IPs off it).
	Remote bool `yaml:"remote,omitempty" json:"remote,omitempty"`
	// Weight is the backend's share of new clients under Maglev
	// selection, relative to the others' (default 1, at most MaxWeight).
	Weight uint16 `yaml:"weight,omitempty" json:"weight,omitempty"`
	// Excluded, when set, says why a backend that serves takes no new
	// connections from this node (another zone's under topology
	// hints): its connections stay, as do those of a backend that is
	// not ready.
	Excluded string `yaml:"-" json:"excluded,omitempty"`
}

// Selection is how a service's backend is chosen.
type Selection string

// Selections.
const (
	SelectRandom Selection = "Random"
	SelectMaglev Selection = "Maglev"
)

// MaxWeight bounds a backend's weight (its share of a Maglev table).
const MaxWeight = 100

// Role is what the load balancer does with a backend.
type Role int

// Backend roles. Kubernetes' rules: ready endpoints take new
// connections; terminating ones that still serve take them only while
// none is ready; the others take none, and their established
// connections are left alone (only a backend gone from the service, or
// terminating and no longer serving, has its connections destroyed).
const (
	RoleReady Role = iota
	RoleFallback
	RoleIdle
)

// Role of the backend (ready defaults to true unless it is terminating).
func (b Backend) Role() Role {
	switch {
	case b.Excluded != "":
		return RoleIdle
	case b.Terminating:
		return RoleFallback
	case b.Ready == nil || *b.Ready:
		return RoleReady
	}
	return RoleIdle
}

// IsReady reports whether the backend takes new connections normally.
func (b Backend) IsReady() bool { return b.Role() == RoleReady }

// TargetPort is the backend's port for service port p, and whether it
// serves p at all.
func (b Backend) TargetPort(p Port) (uint16, bool) {
	if b.Ports == nil {
		return p.TargetPort, true
	}
	n, ok := b.Ports[p.Name]
	return n, ok && n != 0
}

// Service is a named set of virtual IPs and ports and its backends.
type Service struct {
	Name      string        `yaml:"name" json:"name"`
	Namespace string        `yaml:"namespace,omitempty" json:"namespace"`
	VIPs      []netip.Addr  `yaml:"vips" json:"vips"`
	Ports     []Port        `yaml:"ports" json:"ports"`
	Affinity  Affinity      `yaml:"sessionAffinity,omitempty" json:"sessionAffinity"`
	Timeout   time.Duration `yaml:"-" json:"sessionAffinityTimeout,omitempty"`
	TimeoutS  *uint32       `yaml:"sessionAffinityTimeoutSeconds,omitempty" json:"-"`
	Backends  []Backend     `yaml:"backends" json:"backends"`
	// ExternalIPs are more addresses the ports are served on
	// (Kubernetes' externalIPs and load balancer ingress IPs), for the
	// sockets of this node: traffic from outside stays the node's other
	// proxy's. NodeAddrs are this node's addresses its NodePorts are
	// served on.
	ExternalIPs []netip.Addr `yaml:"externalIPs,omitempty" json:"externalIPs,omitempty"`
	NodeAddrs   []netip.Addr `yaml:"nodeAddresses,omitempty" json:"nodeAddresses,omitempty"`
	// InternalTrafficPolicy Local: connections to the cluster IPs go
	// to this node's endpoints only (none: refused); Cluster (or
	// unset): to any.
	InternalTrafficPolicy string `yaml:"internalTrafficPolicy,omitempty" json:"internalTrafficPolicy,omitempty"`
	// Selection is how a connect's backend is chosen among the ready
	// ones: Random (the default, as kube-proxy's iptables mode), or
	// Maglev: by the client's network namespace over a Maglev table, so
	// a client pod keeps its backend while it stays and a change of
	// backends moves the fewest clients (without per-client state).
	Selection Selection `yaml:"selection,omitempty" json:"selection,omitempty"`
	// Choice, when set, says which backends new connections from this
	// node go to (Kubernetes' internalTrafficPolicy or topology hints).
	Choice string `yaml:"-" json:"choice,omitempty"`
}

// Key is the service's namespace/name.
func (s *Service) Key() string { return s.Namespace + "/" + s.Name }

// Frontend is one (VIP, port, protocol) a service answers on.
type Frontend struct {
	VIP      netip.Addr `json:"vip"`
	Port     uint16     `json:"port"`
	Protocol Protocol   `json:"protocol"`
}

func (f Frontend) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(f.VIP, f.Port), f.Protocol)
}

// Binding is one frontend of a service with the service port it
// serves, and whether it is a cluster IP's (internalTrafficPolicy
// applies) or an external one's (an external IP, a load balancer IP, a
// NodePort: connections from this node go to any endpoint, as
// kube-proxy's do whatever the externalTrafficPolicy).
type Binding struct {
	Frontend
	Port    Port
	Cluster bool
}

// Bindings lists every frontend of the service with its port.
func (s *Service) Bindings() []Binding {
	var out []Binding
	for _, p := range s.Ports {
		for _, v := range s.VIPs {
			out = append(out, Binding{Frontend: Frontend{VIP: v, Port: p.Port, Protocol: p.Protocol}, Port: p, Cluster: true})
		}
		for _, v := range s.ExternalIPs {
			out = append(out, Binding{Frontend: Frontend{VIP: v, Port: p.Port, Protocol: p.Protocol}, Port: p})
		}
		if p.NodePort != 0 {
			for _, v := range s.NodeAddrs {
				out = append(out, Binding{Frontend: Frontend{VIP: v, Port: p.NodePort, Protocol: p.Protocol}, Port: p})
			}
		}
	}
	return out
}

// Frontends lists every (address, port, protocol) of the service.
func (s *Service) Frontends() []Frontend {
	var out []Frontend
	for _, b := range s.Bindings() {
		out = append(out, b.Frontend)
	}
	return out
}

// RoleAt is the backend's role for connections to binding at (Role,
// and internalTrafficPolicy: Local for a cluster IP).
func (s *Service) RoleAt(b Backend, at Binding) Role {
	if at.Cluster && s.InternalTrafficPolicy == "Local" && b.Remote {
		return RoleIdle
	}
	return b.Role()
}

// Set is a validated, normalised set of services.
type Set struct {
	Services []*Service
}

// FieldError is a problem at one place of a service source.
type FieldError = yamlsrc.FieldError

// Errors is every problem found; nothing of a source with errors applies.
type Errors = yamlsrc.Errors

// lines locates fields in the source for error messages.
type lines func(field string) int

// normalise fills defaults and checks every rule; it reports all problems.
func normalise(svcs []*Service, at lines) (*Set, error) {
	var errs Errors
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Line: at(field), Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	names := map[string]string{}
	fronts := map[Frontend]string{}
	for i, s := range svcs {
		f := fmt.Sprintf("services[%d]", i)
		if s == nil {
			bad(f, "empty service")
			continue
		}
		if s.Namespace == "" {
			s.Namespace = "default"
		}
		if !dnsLabel(s.Name) {
			bad(f+".name", "%q is not a DNS label (lower-case letters, digits and '-', at most 63)", s.Name)
		}
		if !dnsLabel(s.Namespace) {
			bad(f+".namespace", "%q is not a DNS label", s.Namespace)
		}
		if prev, ok := names[s.Key()]; ok {
			bad(f+".name", "service %s is defined twice (also at %s)", s.Key(), prev)
		}
		names[s.Key()] = f
		if len(s.VIPs) == 0 {
			bad(f+".vips", "a service needs at least one virtual IP")
		}
		fams := map[bool]bool{}
		for j, v := range s.VIPs {
			switch {
			case !v.IsValid():
				bad(fmt.Sprintf("%s.vips[%d]", f, j), "not an IP address")
			case v.Is4In6():
				bad(fmt.Sprintf("%s.vips[%d]", f, j), "%s: write IPv4 addresses in dotted form", v)
			case v.IsUnspecified() || v.IsMulticast() || v.IsLoopback():
				bad(fmt.Sprintf("%s.vips[%d]", f, j), "%s cannot be a service address", v)
			default:
				if fams[v.Is4()] {
					bad(fmt.Sprintf("%s.vips[%d]", f, j), "at most one IPv4 and one IPv6 virtual IP")
				}
				fams[v.Is4()] = true
			}
		}
		for _, list := range []struct {
			name  string
			addrs []netip.Addr
		}{{"externalIPs", s.ExternalIPs}, {"nodeAddresses", s.NodeAddrs}} {
			for j, v := range list.addrs {
				af := fmt.Sprintf("%s.%s[%d]", f, list.name, j)
				switch {
				case !v.IsValid():
					bad(af, "not an IP address")
				case v.Is4In6():
					bad(af, "%s: write IPv4 addresses in dotted form", v)
				case v.IsUnspecified() || v.IsMulticast():
					bad(af, "%s cannot be a service address", v)
				}
			}
		}
		switch s.Selection {
		case "":
			s.Selection = SelectRandom
		case SelectRandom, SelectMaglev:
		default:
			bad(f+".selection", "%q: want Random or Maglev", s.Selection)
		}
		switch s.InternalTrafficPolicy {
		case "", "Cluster", "Local":
		default:
			bad(f+".internalTrafficPolicy", "%q: want Cluster or Local", s.InternalTrafficPolicy)
		}
		if len(s.Ports) == 0 {
			bad(f+".ports", "a service needs at least one port")
		}
		seenPort := map[string]bool{}
		for j := range s.Ports {
			p := &s.Ports[j]
			pf := fmt.Sprintf("%s.ports[%d]", f, j)
			if p.Protocol == "" {
				p.Protocol = TCP
			}
			p.Protocol = Protocol(strings.ToUpper(string(p.Protocol)))
			if p.Protocol != TCP && p.Protocol != UDP {
				bad(pf+".protocol", "%q: want TCP or UDP", p.Protocol)
			}
			if p.Port == 0 {
				bad(pf+".port", "want a port from 1 to 65535")
			}
			if p.TargetPort == 0 {
				p.TargetPort = p.Port
			}
			k := fmt.Sprintf("%d/%s", p.Port, p.Protocol)
			if seenPort[k] {
				bad(pf, "port %s listed twice", k)
			}
			seenPort[k] = true
		}
		switch s.Affinity {
		case "", AffinityNone:
			s.Affinity = AffinityNone
			if s.TimeoutS != nil {
				bad(f+".sessionAffinityTimeoutSeconds", "set only with sessionAffinity: ClientIP")
			}
		case AffinityClientIP:
			s.Timeout = DefaultAffinityTimeout
			if s.TimeoutS != nil {
				if *s.TimeoutS == 0 || *s.TimeoutS > 86400 {
					bad(f+".sessionAffinityTimeoutSeconds", "%d: want 1 to 86400 (Kubernetes' range)", *s.TimeoutS)
				}
				s.Timeout = time.Duration(*s.TimeoutS) * time.Second
			}
		default:
			bad(f+".sessionAffinity", "%q: want None or ClientIP", s.Affinity)
		}
		if len(s.Backends) > MaxBackends {
			bad(f+".backends", "%d backends, at most %d", len(s.Backends), MaxBackends)
		}
		seenIP := map[netip.Addr]bool{}
		for j, b := range s.Backends {
			bf := fmt.Sprintf("%s.backends[%d]", f, j)
			switch {
			case !b.IP.IsValid():
				bad(bf+".ip", "not an IP address")
				continue
			case b.IP.Is4In6():
				bad(bf+".ip", "%s: write IPv4 addresses in dotted form", b.IP)
			case b.IP.IsUnspecified() || b.IP.IsMulticast():
				bad(bf+".ip", "%s cannot be a backend", b.IP)
			case !fams[b.IP.Is4()]:
				bad(bf+".ip", "%s: the service has no virtual IP of this family", b.IP)
			}
			if seenIP[b.IP] {
				bad(bf+".ip", "%s listed twice", b.IP)
			}
			seenIP[b.IP] = true
			if b.Weight > MaxWeight {
				bad(bf+".weight", "%d: want 1 to %d", b.Weight, MaxWeight)
			}
			for name, n := range b.Ports {
				if !slices.ContainsFunc(s.Ports, func(p Port) bool { return p.Name == name }) {
					bad(bf+".ports", "%q names no port of the service", name)
				} else if n == 0 {
					bad(bf+".ports", "%q: want a port from 1 to 65535", name)
				}
			}
		}
		for _, fr := range s.Frontends() {
			if prev, ok := fronts[fr]; ok && fr.VIP.IsValid() {
				bad(f, "%s is already served by %s", fr, prev)
			}
			fronts[fr] = s.Key()
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	set := &Set{Services: svcs}
	slices.SortFunc(set.Services, func(a, b *Service) int { return cmp.Compare(a.Key(), b.Key()) })
	return set, nil
}

func dnsLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, c := range s {
		if lower, digit := c >= 'a' && c <= 'z', c >= '0' && c <= '9'; !lower && !digit && c != '-' {
			return false
		}
	}
	return true
}

// Find returns the service with the given namespace/name (namespace
// "default" when key has none).
func (s *Set) Find(key string) *Service {
	if !strings.Contains(key, "/") {
		key = "default/" + key
	}
	for _, svc := range s.Services {
		if svc.Key() == key {
			return svc
		}
	}
	return nil
}

// NewSet checks services built by a program (such as the Kubernetes
// source) by the same rules as a file.
func NewSet(svcs []*Service) (*Set, error) {
	return normalise(svcs, func(string) int { return 0 })
}
