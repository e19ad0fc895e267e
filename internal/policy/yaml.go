package policy

import (
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/socklane/socklane/internal/yamlsrc"
)

// File is the YAML policy source, for nodes without Kubernetes (or tests):
// the policies, as networking.k8s.io/v1 NetworkPolicy objects, and the
// namespaces and pods they select.
//
//	namespaces:
//	  - {name: shop, labels: {team: a}}
//	pods:
//	  - namespace: shop
//	    name: web-1
//	    labels: {app: web}
//	    ips: [198.18.1.2, "2001:db8:18:1::2"]
//	    ports: [{name: http, port: 8080, protocol: TCP}]
//	    cgroup: /kubepods/pod-web-1   # a pod of this node: its cgroup
//	policies:
//	  - metadata: {name: web-ingress, namespace: shop}
//	    spec:
//	      podSelector: {matchLabels: {app: web}}
//	      ingress:
//	        - from: [{podSelector: {matchLabels: {app: client}}}]
//	          ports: [{port: http}]
type File struct {
	Namespaces []fileNamespace `yaml:"namespaces"`
	Pods       []filePod       `yaml:"pods"`
	Policies   []filePolicy    `yaml:"policies"`
}

type fileNamespace struct {
	Name   string            `yaml:"name"`
	Labels map[string]string `yaml:"labels"`
}

type filePod struct {
	Namespace string            `yaml:"namespace"`
	Name      string            `yaml:"name"`
	Labels    map[string]string `yaml:"labels"`
	IPs       []string          `yaml:"ips"`
	Ports     []filePodPort     `yaml:"ports"`
	Cgroup    string            `yaml:"cgroup"`
}

type filePodPort struct {
	Name     string `yaml:"name"`
	Port     int    `yaml:"port"`
	Protocol string `yaml:"protocol"`
}

type filePolicy struct {
	APIVersion string       `yaml:"apiVersion"`
	Kind       string       `yaml:"kind"`
	Metadata   fileMetadata `yaml:"metadata"`
	Spec       fileSpec     `yaml:"spec"`
}

type fileMetadata struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type fileSpec struct {
	PodSelector fileSelector  `yaml:"podSelector"`
	PolicyTypes []string      `yaml:"policyTypes"`
	Ingress     []fileIngress `yaml:"ingress"`
	Egress      []fileEgress  `yaml:"egress"`
}

type fileIngress struct {
	From  []filePeer `yaml:"from"`
	Ports []filePort `yaml:"ports"`
}

type fileEgress struct {
	To    []filePeer `yaml:"to"`
	Ports []filePort `yaml:"ports"`
}

type filePeer struct {
	PodSelector       *fileSelector `yaml:"podSelector"`
	NamespaceSelector *fileSelector `yaml:"namespaceSelector"`
	IPBlock           *fileIPBlock  `yaml:"ipBlock"`
}

type fileSelector struct {
	MatchLabels      map[string]string `yaml:"matchLabels"`
	MatchExpressions []fileExpr        `yaml:"matchExpressions"`
}

type fileExpr struct {
	Key      string   `yaml:"key"`
	Operator string   `yaml:"operator"`
	Values   []string `yaml:"values"`
}

type fileIPBlock struct {
	CIDR   string   `yaml:"cidr"`
	Except []string `yaml:"except"`
}

type filePort struct {
	Protocol string     `yaml:"protocol"`
	Port     *portValue `yaml:"port"`
	EndPort  *int32     `yaml:"endPort"`
}

// portValue is a number or a name, as intstr.IntOrString.
type portValue struct{ intstr.IntOrString }

func (p *portValue) UnmarshalYAML(n *yaml.Node) error {
	var i int32
	if n.Tag == "!!int" {
		if err := n.Decode(&i); err != nil {
			return err
		}
		p.IntOrString = intstr.FromInt32(i)
		return nil
	}
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	p.IntOrString = intstr.FromString(s)
	return nil
}

// Parse reads and validates a YAML policy source. Every problem is
// reported with its line and field; a source with any problem yields no
// Set. Pods' cgroups are not resolved here (node.ApplyPolicies does).
func Parse(src []byte) (*Set, error) {
	idx, err := yamlsrc.Read(src, "policy")
	if err != nil {
		return nil, err
	}
	var f File
	if err := yamlsrc.DecodeStrict(src, "policy", &f); err != nil {
		return nil, err
	}
	set, errs := f.set()
	for _, e := range errs {
		e.Line = idx.Line(e.Field)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return set, nil
}

// ParseFile is Parse on a file's contents.
func ParseFile(path string) (*Set, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading policy file: %w", err)
	}
	set, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return set, nil
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

func (f *File) set() (*Set, yamlsrc.Errors) {
	var errs yamlsrc.Errors
	bad := func(field, format string, args ...any) {
		errs = append(errs, &yamlsrc.FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	s := &Set{}
	seen := map[string]string{}
	for i, n := range f.Namespaces {
		field := fmt.Sprintf("namespaces[%d]", i)
		if !dnsLabel.MatchString(n.Name) {
			bad(field+".name", "%q is not a namespace name (lower-case letters, digits, '-')", n.Name)
		}
		if prev, ok := seen["ns/"+n.Name]; ok {
			bad(field+".name", "namespace %q is given twice (first at %s)", n.Name, prev)
		}
		seen["ns/"+n.Name] = field
		s.Namespaces = append(s.Namespaces, Namespace(n))
	}
	addrs := map[netip.Addr]string{}
	for i, fp := range f.Pods {
		field := fmt.Sprintf("pods[%d]", i)
		p := &Pod{Namespace: fp.Namespace, Name: fp.Name, Labels: fp.Labels, Cgroup: fp.Cgroup}
		if p.Namespace == "" {
			p.Namespace = "default"
		}
		if fp.Name == "" {
			bad(field+".name", "missing")
		}
		if prev, ok := seen["pod/"+p.Key()]; ok {
			bad(field+".name", "pod %s is given twice (first at %s)", p.Key(), prev)
		}
		seen["pod/"+p.Key()] = field
		for j, ip := range fp.IPs {
			a, err := netip.ParseAddr(ip)
			if err != nil {
				bad(fmt.Sprintf("%s.ips[%d]", field, j), "%q is not an IP address", ip)
				continue
			}
			a = a.Unmap()
			if prev, ok := addrs[a]; ok {
				bad(fmt.Sprintf("%s.ips[%d]", field, j), "%s is also the address of %s", a, prev)
			}
			addrs[a] = p.Key()
			p.IPs = append(p.IPs, a)
		}
		for j, pp := range fp.Ports {
			pf := fmt.Sprintf("%s.ports[%d]", field, j)
			proto, err := ParseProtocol(pp.Protocol)
			if err != nil {
				bad(pf+".protocol", "%v", err)
			}
			if pp.Port < 1 || pp.Port > 65535 {
				bad(pf+".port", "%d: want 1-65535", pp.Port)
			}
			if pp.Name == "" || len(pp.Name) > 15 {
				bad(pf+".name", "%q: a port name has 1-15 characters", pp.Name)
			}
			p.Ports = append(p.Ports, NamedPort{Name: pp.Name, Port: uint16(pp.Port), Protocol: proto})
		}
		s.Pods = append(s.Pods, p)
	}
	for i, fp := range f.Policies {
		field := fmt.Sprintf("policies[%d]", i)
		if fp.APIVersion != "" && fp.APIVersion != "networking.k8s.io/v1" {
			bad(field+".apiVersion", "%q: want networking.k8s.io/v1", fp.APIVersion)
		}
		if fp.Kind != "" && fp.Kind != "NetworkPolicy" {
			bad(field+".kind", "%q: want NetworkPolicy", fp.Kind)
		}
		pol, es := FromK8s(fp.k8s())
		for _, e := range es {
			e.Field = field + "." + e.Field
		}
		errs = append(errs, es...)
		if prev, ok := seen["policy/"+pol.Key()]; ok && pol.Name != "" {
			bad(field+".metadata.name", "policy %s is given twice (first at %s)", pol.Key(), prev)
		}
		seen["policy/"+pol.Key()] = field
		s.Policies = append(s.Policies, pol)
	}
	return s, errs
}

func (fp *filePolicy) k8s() *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fp.Metadata.Name, Namespace: fp.Metadata.Namespace}}
	np.Spec.PodSelector = *fp.Spec.PodSelector.k8s()
	for _, t := range fp.Spec.PolicyTypes {
		np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyType(t))
	}
	for _, r := range fp.Spec.Ingress {
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: peersK8s(r.From), Ports: portsK8s(r.Ports)})
	}
	for _, r := range fp.Spec.Egress {
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: peersK8s(r.To), Ports: portsK8s(r.Ports)})
	}
	return np
}

func (s *fileSelector) k8s() *metav1.LabelSelector {
	if s == nil {
		return nil
	}
	ls := &metav1.LabelSelector{MatchLabels: s.MatchLabels}
	for _, e := range s.MatchExpressions {
		ls.MatchExpressions = append(ls.MatchExpressions, metav1.LabelSelectorRequirement{
			Key: e.Key, Operator: metav1.LabelSelectorOperator(e.Operator), Values: e.Values})
	}
	return ls
}

func peersK8s(in []filePeer) []networkingv1.NetworkPolicyPeer {
	var out []networkingv1.NetworkPolicyPeer
	for _, p := range in {
		np := networkingv1.NetworkPolicyPeer{PodSelector: p.PodSelector.k8s(), NamespaceSelector: p.NamespaceSelector.k8s()}
		if p.IPBlock != nil {
			np.IPBlock = &networkingv1.IPBlock{CIDR: p.IPBlock.CIDR, Except: p.IPBlock.Except}
		}
		out = append(out, np)
	}
	return out
}

func portsK8s(in []filePort) []networkingv1.NetworkPolicyPort {
	var out []networkingv1.NetworkPolicyPort
	for _, p := range in {
		np := networkingv1.NetworkPolicyPort{EndPort: p.EndPort}
		if p.Protocol != "" {
			pr := corev1.Protocol(strings.ToUpper(p.Protocol))
			np.Protocol = &pr
		}
		if p.Port != nil {
			v := p.Port.IntOrString
			np.Port = &v
		}
		out = append(out, np)
	}
	return out
}
