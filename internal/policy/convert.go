package policy

import (
	"fmt"
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/socklane/socklane/internal/yamlsrc"
)

// FromK8s turns a NetworkPolicy into the model, checking what the API
// server checks (and what socklane cannot enforce). Problems name their
// field from the object's root (spec.ingress[0].from[1].ipBlock.cidr).
func FromK8s(np *networkingv1.NetworkPolicy) (*Policy, yamlsrc.Errors) {
	var errs yamlsrc.Errors
	bad := func(field, format string, args ...any) {
		errs = append(errs, &yamlsrc.FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	p := &Policy{Namespace: np.Namespace, Name: np.Name, Source: np}
	if p.Namespace == "" {
		p.Namespace = "default"
	}
	if p.Name == "" {
		bad("metadata.name", "missing: every policy needs a name")
	}
	sel, err := selector(&np.Spec.PodSelector)
	if err != nil {
		bad("spec.podSelector", "%v", err)
	}
	p.Selector = sel
	// policyTypes defaults as in Kubernetes: Ingress always, Egress if
	// the policy has egress rules.
	types := np.Spec.PolicyTypes
	if len(types) == 0 {
		types = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		if len(np.Spec.Egress) > 0 {
			types = append(types, networkingv1.PolicyTypeEgress)
		}
	}
	for i, t := range types {
		switch t {
		case networkingv1.PolicyTypeIngress:
			p.Isolates[Ingress] = true
		case networkingv1.PolicyTypeEgress:
			p.Isolates[Egress] = true
		default:
			bad(fmt.Sprintf("spec.policyTypes[%d]", i), "%q: want Ingress or Egress", t)
		}
	}
	for i, r := range np.Spec.Ingress {
		rule, es := convertRule(fmt.Sprintf("spec.ingress[%d]", i), "from", r.From, r.Ports)
		errs = append(errs, es...)
		p.Rules[Ingress] = append(p.Rules[Ingress], rule)
	}
	for i, r := range np.Spec.Egress {
		rule, es := convertRule(fmt.Sprintf("spec.egress[%d]", i), "to", r.To, r.Ports)
		errs = append(errs, es...)
		p.Rules[Egress] = append(p.Rules[Egress], rule)
	}
	return p, errs
}

func selector(s *metav1.LabelSelector) (labels.Selector, error) {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return labels.Nothing(), err
	}
	return sel, nil
}

func convertRule(field, peersName string, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) (Rule, yamlsrc.Errors) {
	var errs yamlsrc.Errors
	bad := func(f, format string, args ...any) {
		errs = append(errs, &yamlsrc.FieldError{Field: f, Msg: fmt.Sprintf(format, args...)})
	}
	var r Rule
	for i, pe := range peers {
		f := fmt.Sprintf("%s.%s[%d]", field, peersName, i)
		var peer Peer
		given := 0
		if pe.PodSelector != nil {
			given++
			s, err := selector(pe.PodSelector)
			if err != nil {
				bad(f+".podSelector", "%v", err)
			}
			peer.Pods = s
		}
		if pe.NamespaceSelector != nil {
			given++
			s, err := selector(pe.NamespaceSelector)
			if err != nil {
				bad(f+".namespaceSelector", "%v", err)
			}
			peer.Namespaces = s
		}
		if pe.IPBlock != nil {
			if given > 0 {
				bad(f+".ipBlock", "ipBlock cannot be given with podSelector or namespaceSelector in one peer")
			}
			given++
			b, es := convertBlock(f+".ipBlock", pe.IPBlock)
			errs = append(errs, es...)
			peer.Block = b
		}
		if given == 0 {
			bad(f, "a peer needs podSelector, namespaceSelector or ipBlock")
		}
		r.Peers = append(r.Peers, peer)
	}
	for i, pt := range ports {
		f := fmt.Sprintf("%s.ports[%d]", field, i)
		var port Port
		proto := ""
		if pt.Protocol != nil {
			proto = string(*pt.Protocol)
		}
		pr, err := ParseProtocol(proto)
		if err != nil {
			bad(f+".protocol", "%v", err)
		}
		port.Protocol = pr
		if pt.Port != nil {
			switch pt.Port.Type {
			case intstr.Int:
				if pt.Port.IntVal < 1 || pt.Port.IntVal > 65535 {
					bad(f+".port", "%d: want 1-65535 or a port name", pt.Port.IntVal)
				} else {
					port.Port = uint16(pt.Port.IntVal)
				}
			case intstr.String:
				if pt.Port.StrVal == "" || len(pt.Port.StrVal) > 15 {
					bad(f+".port", "%q: a port name has 1-15 characters", pt.Port.StrVal)
				}
				port.Name = pt.Port.StrVal
			}
		}
		if pt.EndPort != nil {
			switch {
			case pt.Port == nil || port.Name != "":
				bad(f+".endPort", "endPort needs a numeric port")
			case *pt.EndPort < int32(port.Port) || *pt.EndPort > 65535:
				bad(f+".endPort", "%d: want from port (%d) to 65535", *pt.EndPort, port.Port)
			default:
				port.End = uint16(*pt.EndPort)
			}
		}
		r.Ports = append(r.Ports, port)
	}
	return r, errs
}

func convertBlock(field string, b *networkingv1.IPBlock) (*Block, yamlsrc.Errors) {
	var errs yamlsrc.Errors
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return nil, yamlsrc.Errors{{Field: field + ".cidr", Msg: fmt.Sprintf("%q is not a CIDR", b.CIDR)}}
	}
	out := &Block{CIDR: cidr.Masked()}
	for i, e := range b.Except {
		f := fmt.Sprintf("%s.except[%d]", field, i)
		ep, err := netip.ParsePrefix(e)
		if err != nil {
			errs = append(errs, &yamlsrc.FieldError{Field: f, Msg: fmt.Sprintf("%q is not a CIDR", e)})
			continue
		}
		ep = ep.Masked()
		if !within(ep, out.CIDR) || ep.Bits() == out.CIDR.Bits() {
			errs = append(errs, &yamlsrc.FieldError{Field: f, Msg: fmt.Sprintf("%s is not strictly inside cidr %s", ep, out.CIDR)})
			continue
		}
		out.Except = append(out.Except, ep)
	}
	return out, errs
}
