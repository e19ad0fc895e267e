// Package netpoltest is the NetworkPolicy truth table shared by the
// policy package's tests and the end-to-end tests, in the style of the
// upstream netpol e2e suite: namespaces x, y and z with pods a, b and c
// each, servers on ports 80 and 81 (and 53/UDP), TCP and UDP; every
// scenario gives its policies and, written out by hand, which probes it
// allows.
package netpoltest

import (
	"bytes"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"text/template"
)

// Namespaces and pod names of the table.
var (
	Namespaces = []string{"x", "y", "z"}
	PodNames   = []string{"a", "b", "c"}
)

// Pod names one pod: ns/name.
type Pod struct{ NS, Name string }

func (p Pod) String() string { return p.NS + "/" + p.Name }

// Pods are all nine.
func Pods() []Pod {
	var out []Pod
	for _, ns := range Namespaces {
		for _, n := range PodNames {
			out = append(out, Pod{ns, n})
		}
	}
	return out
}

// Port is a port and protocol ("tcp" or "udp").
type Port struct {
	Port  uint16
	Proto string
}

func (p Port) String() string { return fmt.Sprintf("%d/%s", p.Port, p.Proto) }

// DefaultPorts are probed unless a scenario says otherwise.
var DefaultPorts = []Port{{80, "tcp"}, {81, "tcp"}, {80, "udp"}, {81, "udp"}}

// ServerPorts are what every pod serves: ports 80 and 81 over TCP and
// UDP, 53 over UDP.
var ServerPorts = []Port{{80, "tcp"}, {81, "tcp"}, {80, "udp"}, {81, "udp"}, {53, "udp"}}

// Probe is one try: from a pod to a pod's port.
type Probe struct {
	From, To Pod
	Port
}

// Scenario is a set of policies and the table it must produce.
type Scenario struct {
	Name string
	// Policies are YAML list items of the policy file's policies
	// (templates: {{ip "y/b"}} is a pod's IPv4 address, {{net}} the
	// pods' /24).
	Policies string
	// Labels replaces pods' labels (a pod relabelled).
	Labels map[string]map[string]string
	Ports  []Port
	Allow  func(Probe) bool
}

// Probes are the scenario's tries: every ordered pair of pods, on each
// port.
func (s *Scenario) Probes() []Probe {
	ports := s.Ports
	if ports == nil {
		ports = DefaultPorts
	}
	var out []Probe
	for _, f := range Pods() {
		for _, t := range Pods() {
			for _, p := range ports {
				out = append(out, Probe{f, t, p})
			}
		}
	}
	return out
}

// Addressing gives the pods' addresses (IPv4, and IPv6 if any) and
// cgroups.
type Addressing struct {
	IPs     map[Pod]netip.Addr
	IPv6    map[Pod]netip.Addr
	Cgroups map[Pod]string
}

// File renders the scenario as a policy file over the nine pods.
func (s *Scenario) File(a Addressing) (string, error) {
	var b bytes.Buffer
	b.WriteString("namespaces:\n")
	for _, ns := range Namespaces {
		fmt.Fprintf(&b, "  - {name: %s, labels: {ns: %s}}\n", ns, ns)
	}
	b.WriteString("pods:\n")
	for _, p := range Pods() {
		labels := map[string]string{"pod": p.Name}
		if l, ok := s.Labels[p.String()]; ok {
			labels = l
		}
		var ls []string
		for k, v := range labels {
			ls = append(ls, k+": "+v)
		}
		sort.Strings(ls)
		ips := a.IPs[p].String()
		if v6, ok := a.IPv6[p]; ok {
			ips += `, "` + v6.String() + `"`
		}
		fmt.Fprintf(&b, "  - namespace: %s\n    name: %s\n    labels: {%s}\n    ips: [%s]\n", p.NS, p.Name, strings.Join(ls, ", "), ips)
		if cg := a.Cgroups[p]; cg != "" {
			fmt.Fprintf(&b, "    cgroup: %s\n", cg)
		}
		b.WriteString("    ports:\n")
		for _, sp := range ServerPorts {
			fmt.Fprintf(&b, "      - {name: serve-%d-%s, port: %d, protocol: %s}\n", sp.Port, sp.Proto, sp.Port, strings.ToUpper(sp.Proto))
		}
	}
	if strings.TrimSpace(s.Policies) == "" {
		b.WriteString("policies: []\n")
		return b.String(), nil
	}
	b.WriteString("policies:\n")
	tpl, err := template.New(s.Name).Funcs(template.FuncMap{
		"ip": func(p string) (string, error) {
			ns, n, _ := strings.Cut(p, "/")
			ip, ok := a.IPs[Pod{ns, n}]
			if !ok {
				return "", fmt.Errorf("no pod %s", p)
			}
			return ip.String(), nil
		},
		"net": func() string {
			return netip.PrefixFrom(a.IPs[Pod{"x", "a"}], 24).Masked().String()
		},
	}).Parse(s.Policies)
	if err != nil {
		return "", err
	}
	if err := tpl.Execute(&b, nil); err != nil {
		return "", err
	}
	return b.String(), nil
}
