package policy

import (
	"fmt"
	"net/netip"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
)

// Endpoint is one end of a flow: an address and the pod there (nil for
// an address no pod has).
type Endpoint struct {
	Pod  *Pod
	Addr netip.Addr
}

// Verdict is a decision with what made it.
type Verdict struct {
	Allowed bool
	// Dir is the direction that denied, or the last that allowed.
	Dir Direction
	// Policy and Rule name the rule that allowed (Rule counts from 0),
	// or a policy isolating the denied end (Rule -1).
	Policy string
	Rule   int
	Reason string
}

func (v Verdict) String() string {
	if v.Allowed {
		return "allowed: " + v.Reason
	}
	return "denied: " + v.Reason
}

// Endpoint finds the pod with address a (nil if none).
func (s *Set) Endpoint(a netip.Addr) Endpoint {
	for _, p := range s.Pods {
		for _, ip := range p.IPs {
			if ip == a {
				return Endpoint{Pod: p, Addr: a}
			}
		}
	}
	return Endpoint{Addr: a}
}

// Pod finds a pod by namespace/name.
func (s *Set) Pod(key string) *Pod {
	for _, p := range s.Pods {
		if p.Key() == key {
			return p
		}
	}
	return nil
}

// Decide judges a new flow from one endpoint to another's port, as
// Kubernetes NetworkPolicy has it: the client's egress rules if it is
// isolated for egress, then the server's ingress rules if it is isolated
// for ingress (this node's own addresses are always let in).
func (s *Set) Decide(from, to Endpoint, port uint16, proto Protocol) Verdict {
	if from.Addr.IsLoopback() || to.Addr.IsLoopback() {
		return Verdict{Allowed: true, Rule: -1, Reason: "loopback traffic is not subject to policy"}
	}
	nsLabels := s.namespaceLabels()
	v := Verdict{Allowed: true, Rule: -1, Reason: "no policy isolates either end"}
	if from.Pod != nil {
		if d, ok := s.judge(Egress, from.Pod, to, port, proto, nsLabels); !ok || d.Policy != "" {
			v = d
			if !d.Allowed {
				return v
			}
		}
	}
	if to.Pod != nil {
		if s.isHost(from.Addr) {
			if s.isolated(Ingress, to.Pod) != nil {
				return Verdict{Allowed: true, Dir: Ingress, Rule: -1, Reason: "traffic from the pod's node is always allowed"}
			}
			return v
		}
		if d, ok := s.judge(Ingress, to.Pod, from, port, proto, nsLabels); !ok || d.Policy != "" {
			return d
		}
	}
	return v
}

func (s *Set) isHost(a netip.Addr) bool {
	for _, h := range s.Host {
		if h == a {
			return true
		}
	}
	return false
}

// isolated returns the policies isolating pod p in direction d.
func (s *Set) isolated(d Direction, p *Pod) []*Policy {
	var out []*Policy
	for _, pol := range s.Policies {
		if pol.Isolates[d] && pol.Selects(p) {
			out = append(out, pol)
		}
	}
	return out
}

// judge applies the rules of direction d of the policies selecting pod
// p to the peer on port/proto. ok is false for a denial; a verdict with
// no Policy means p is not isolated in d.
func (s *Set) judge(d Direction, p *Pod, peer Endpoint, port uint16, proto Protocol, nsLabels map[string]labels.Set) (Verdict, bool) {
	pols := s.isolated(d, p)
	if len(pols) == 0 {
		return Verdict{Allowed: true, Dir: d, Rule: -1}, true
	}
	for _, pol := range pols {
		for i, r := range pol.Rules[d] {
			if s.ruleAllows(pol, &r, d, p, peer, port, proto, nsLabels) {
				return Verdict{Allowed: true, Dir: d, Policy: pol.Key(), Rule: i,
					Reason: fmt.Sprintf("%s rule %d of %s allows it", d, i, pol.Key())}, true
			}
		}
	}
	names := make([]string, len(pols))
	for i, pol := range pols {
		names[i] = pol.Key()
	}
	return Verdict{Dir: d, Policy: pols[0].Key(), Rule: -1,
		Reason: fmt.Sprintf("%s is isolated for %s by %s and no rule allows it", p.Key(), d, strings.Join(names, ", "))}, false
}

func (s *Set) ruleAllows(pol *Policy, r *Rule, d Direction, p *Pod, peer Endpoint, port uint16, proto Protocol, nsLabels map[string]labels.Set) bool {
	if len(r.Peers) > 0 {
		ok := false
		for i := range r.Peers {
			if r.Peers[i].matches(pol.Namespace, peer.Pod, peer.Addr, nsLabels) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if len(r.Ports) == 0 {
		return true
	}
	for _, pt := range r.Ports {
		if pt.Protocol != proto {
			continue
		}
		switch {
		case pt.Name != "":
			server := p
			if d == Egress {
				server = peer.Pod
			}
			if server == nil {
				continue
			}
			if n, ok := server.port(pt.Name, proto); ok && n == port {
				return true
			}
		case pt.Port == 0:
			return true
		case port >= pt.Port && port <= max(pt.End, pt.Port):
			return true
		}
	}
	return false
}
