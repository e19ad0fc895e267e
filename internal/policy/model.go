// Package policy is socklane's model of Kubernetes NetworkPolicy
// (networking.k8s.io/v1): the policies, the namespaces and pods they select,
// the YAML source, the compiler into the tables the datapath looks up, and
// a decision with its reason for `socklane policy test`. No kernel code.
package policy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Protocol of a port rule.
type Protocol uint8

// Protocols, by their IP protocol numbers.
const (
	TCP Protocol = 6
	UDP Protocol = 17
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	}
	return fmt.Sprintf("protocol(%d)", uint8(p))
}

// ParseProtocol reads TCP or UDP (any case); "" is TCP, as in Kubernetes.
func ParseProtocol(s string) (Protocol, error) {
	switch strings.ToUpper(s) {
	case "", "TCP":
		return TCP, nil
	case "UDP":
		return UDP, nil
	case "SCTP":
		return 0, fmt.Errorf("protocol SCTP is not enforced by socklane (TCP and UDP are)")
	}
	return 0, fmt.Errorf("protocol %q: want TCP or UDP", s)
}

// Direction of traffic relative to the pod a policy selects.
type Direction uint8

// Directions.
const (
	Ingress Direction = iota
	Egress
)

func (d Direction) String() string {
	if d == Egress {
		return "egress"
	}
	return "ingress"
}

// Namespace is a namespace's name and labels.
type Namespace struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
}

// NamedPort is a container port with a name.
type NamedPort struct {
	Name     string   `json:"name"`
	Port     uint16   `json:"port"`
	Protocol Protocol `json:"protocol"`
}

// Pod is a workload: where it runs, its labels, addresses and named ports.
// Cgroup (a cgroup v2 directory) is set for the pods of this node, whose
// processes the datapath recognises by it; CgroupID is resolved from it.
type Pod struct {
	Namespace string            `json:"namespace"`
	Name      string            `json:"name"`
	Labels    map[string]string `json:"labels,omitempty"`
	IPs       []netip.Addr      `json:"ips,omitempty"`
	Ports     []NamedPort       `json:"ports,omitempty"`
	Cgroup    string            `json:"cgroup,omitempty"`
	CgroupID  uint64            `json:"cgroup_id,omitempty"`
}

// Key is namespace/name.
func (p *Pod) Key() string { return p.Namespace + "/" + p.Name }

// Local reports whether the pod runs on this node.
func (p *Pod) Local() bool { return p.CgroupID != 0 }

// port resolves a named port on this pod.
func (p *Pod) port(name string, proto Protocol) (uint16, bool) {
	for _, np := range p.Ports {
		if np.Name == name && np.Protocol == proto {
			return np.Port, true
		}
	}
	return 0, false
}

// Block is an ipBlock: a CIDR less its exceptions.
type Block struct {
	CIDR   netip.Prefix
	Except []netip.Prefix
}

// Contains reports whether a is in the block.
func (b *Block) Contains(a netip.Addr) bool {
	if !b.CIDR.Contains(a) {
		return false
	}
	for _, e := range b.Except {
		if e.Contains(a) {
			return false
		}
	}
	return true
}

// covers reports whether every address of p is in the block.
func (b *Block) covers(p netip.Prefix) bool {
	if !within(p, b.CIDR) {
		return false
	}
	for _, e := range b.Except {
		if within(p, e) {
			return false
		}
	}
	return true
}

// within reports whether p lies inside q.
func within(p, q netip.Prefix) bool {
	return p.Addr().Is4() == q.Addr().Is4() && p.Bits() >= q.Bits() && q.Contains(p.Addr())
}

func (b *Block) String() string {
	s := b.CIDR.String()
	for _, e := range b.Except {
		s += " except " + e.String()
	}
	return s
}

// Peer is one entry of a rule's from or to: pods (Pods in the policy's
// namespace, or Pods in the namespaces matching Namespaces, both given:
// AND) or a Block. A nil selector was not given; an empty one matches all.
type Peer struct {
	Pods       labels.Selector
	Namespaces labels.Selector
	Block      *Block
}

// Port is one entry of a rule's ports: a protocol and a port (0: every
// port), a range up to End, or a named port (resolved on the pod that
// serves it: the selected pod for ingress, the peer for egress).
type Port struct {
	Protocol Protocol
	Port     uint16
	End      uint16
	Name     string
}

func (p Port) String() string {
	switch {
	case p.Name != "":
		return fmt.Sprintf("%s/%s", p.Name, p.Protocol)
	case p.Port == 0:
		return fmt.Sprintf("*/%s", p.Protocol)
	case p.End > p.Port:
		return fmt.Sprintf("%d-%d/%s", p.Port, p.End, p.Protocol)
	}
	return fmt.Sprintf("%d/%s", p.Port, p.Protocol)
}

// Rule allows traffic from (ingress) or to (egress) its peers on its
// ports; no peers means every peer, no ports every port.
type Rule struct {
	Peers []Peer
	Ports []Port
}

// Policy is one NetworkPolicy.
type Policy struct {
	Namespace string
	Name      string
	// Selector picks the pods of Namespace the policy applies to.
	Selector labels.Selector
	// Isolates says for which directions the selected pods are isolated
	// (policyTypes, defaulted as Kubernetes does).
	Isolates [2]bool
	Rules    [2][]Rule
	// Source is the object the policy was made from.
	Source *networkingv1.NetworkPolicy
}

// Key is namespace/name.
func (p *Policy) Key() string { return p.Namespace + "/" + p.Name }

// Set is everything a decision needs: policies, namespaces, pods (this
// node's and, for policies naming remote pods, the cluster's), and this
// node's own addresses (always let in).
type Set struct {
	Policies   []*Policy
	Namespaces []Namespace
	Pods       []*Pod
	Host       []netip.Addr
}

// sort orders everything by name, so that compiling is deterministic.
func (s *Set) sort() {
	slices.SortFunc(s.Policies, func(a, b *Policy) int { return cmp.Compare(a.Key(), b.Key()) })
	slices.SortFunc(s.Namespaces, func(a, b Namespace) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(s.Pods, func(a, b *Pod) int { return cmp.Compare(a.Key(), b.Key()) })
}

// namespaceLabels returns the labels of namespace ns (with the
// kubernetes.io/metadata.name label the API server sets on every one).
func (s *Set) namespaceLabels() map[string]labels.Set {
	out := map[string]labels.Set{}
	for _, n := range s.Namespaces {
		l := labels.Set{}
		for k, v := range n.Labels {
			l[k] = v
		}
		l["kubernetes.io/metadata.name"] = n.Name
		out[n.Name] = l
	}
	for _, p := range s.Pods {
		if _, ok := out[p.Namespace]; !ok {
			out[p.Namespace] = labels.Set{"kubernetes.io/metadata.name": p.Namespace}
		}
	}
	return out
}

// Selects reports whether policy pol applies to pod p.
func (pol *Policy) Selects(p *Pod) bool {
	return pol.Namespace == p.Namespace && pol.Selector.Matches(labels.Set(p.Labels))
}

// matches reports whether peer names the endpoint at addr (pod: the pod
// there, or nil) for a policy of namespace ns (nsLabels: every
// namespace's labels). A block is judged by the address alone, pod or not.
func (peer *Peer) matches(ns string, pod *Pod, addr netip.Addr, nsLabels map[string]labels.Set) bool {
	if peer.Block != nil {
		return addr.IsValid() && peer.Block.Contains(addr)
	}
	if pod == nil {
		return false
	}
	if peer.Namespaces == nil {
		if pod.Namespace != ns {
			return false
		}
	} else if !peer.Namespaces.Matches(nsLabels[pod.Namespace]) {
		return false
	}
	return peer.Pods == nil || peer.Pods.Matches(labels.Set(pod.Labels))
}
