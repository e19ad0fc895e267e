package policy_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/socklane/socklane/internal/policy"
	"github.com/socklane/socklane/internal/policy/netpoltest"
)

// addressing puts the nine pods at 198.18.1.2-10, all on this node.
func addressing() netpoltest.Addressing {
	a := netpoltest.Addressing{IPs: map[netpoltest.Pod]netip.Addr{}, Cgroups: map[netpoltest.Pod]string{}}
	for i, p := range netpoltest.Pods() {
		a.IPs[p] = netip.AddrFrom4([4]byte{198, 18, 1, byte(i + 2)})
		a.Cgroups[p] = "pods/" + p.NS + "-" + p.Name
	}
	return a
}

func parse(t *testing.T, s *netpoltest.Scenario, a netpoltest.Addressing) *policy.Set {
	t.Helper()
	src, err := s.File(a)
	if err != nil {
		t.Fatal(err)
	}
	set, err := policy.Parse([]byte(src))
	if err != nil {
		t.Fatalf("%s: %v\n%s", s.Name, err, src)
	}
	for i, p := range set.Pods {
		p.CgroupID = uint64(1000 + i)
	}
	set.Host = []netip.Addr{netip.MustParseAddr("198.18.1.1")}
	return set
}

// kernel judges a probe the way the datapath does, from the compiled
// tables: at connect (egress by the client's cgroup, ingress of a local
// server with the client's class), then at the server's first packet
// (ingress by the client's address).
type kernel struct{ t *policy.Tables }

func (k kernel) addr(a netip.Addr) (policy.Entry, bool) {
	best, bits, ok := policy.Entry{}, -1, false
	for _, e := range k.t.IPs {
		if e.Prefix.Contains(a) && e.Prefix.Bits() > bits {
			best, bits, ok = e.Entry, e.Prefix.Bits(), true
		}
	}
	return best, ok
}

func (k kernel) rule(ep uint32, d policy.Direction, class uint32, proto policy.Protocol, port uint16) bool {
	for _, r := range k.t.Rules {
		if r.Endpoint != ep || r.Dir != d || (r.Class != class && r.Class != policy.ClassAny) {
			continue
		}
		if r.Protocol == 0 {
			return true
		}
		if r.Protocol == proto && (r.Bits == 0 || port>>(16-r.Bits) == r.Port>>(16-r.Bits)) {
			return true
		}
	}
	return false
}

func (k kernel) judge(cgroup uint64, from, to netip.Addr, port uint16, proto policy.Protocol) bool {
	var self *policy.Entry
	for i := range k.t.Cgroups {
		if k.t.Cgroups[i].ID == cgroup {
			self = &k.t.Cgroups[i].Entry
		}
	}
	dst, _ := k.addr(to)
	if self != nil {
		if self.Isolated[policy.Egress] && !k.rule(self.Endpoint, policy.Egress, dst.Class, proto, port) {
			return false
		}
		if dst.Endpoint != 0 && dst.Isolated[policy.Ingress] && !k.rule(dst.Endpoint, policy.Ingress, self.Class, proto, port) {
			return false
		}
	}
	src, _ := k.addr(from)
	if dst.Endpoint != 0 && dst.Isolated[policy.Ingress] && src.Identity != policy.IdentityHost &&
		!k.rule(dst.Endpoint, policy.Ingress, src.Class, proto, port) {
		return false
	}
	return true
}

func protoOf(s string) policy.Protocol {
	if s == "udp" {
		return policy.UDP
	}
	return policy.TCP
}

// TestTruthTable checks every scenario both ways: the decision that
// `policy test` explains, and the compiled tables looked up as the
// datapath looks them up.
func TestTruthTable(t *testing.T) {
	a := addressing()
	var prev map[string]uint32
	for _, sc := range netpoltest.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			set := parse(t, &sc, a)
			tables, err := policy.Compile(set, prev)
			if err != nil {
				t.Fatal(err)
			}
			prev = tables.IDs
			k := kernel{tables}
			cgroup := map[netpoltest.Pod]uint64{}
			for _, p := range set.Pods {
				cgroup[netpoltest.Pod{NS: p.Namespace, Name: p.Name}] = p.CgroupID
			}
			var wrong []string
			for _, pr := range sc.Probes() {
				want := sc.Allow(pr)
				from, to := set.Endpoint(a.IPs[pr.From]), set.Endpoint(a.IPs[pr.To])
				v := set.Decide(from, to, pr.Port.Port, protoOf(pr.Proto))
				got := k.judge(cgroup[pr.From], a.IPs[pr.From], a.IPs[pr.To], pr.Port.Port, protoOf(pr.Proto))
				if v.Allowed != want || got != want {
					wrong = append(wrong, fmt.Sprintf("%s -> %s %s: want %v, decide %v (%s), tables %v", pr.From, pr.To, pr.Port, want, v.Allowed, v.Reason, got))
				}
			}
			if len(wrong) > 0 {
				t.Errorf("%d of %d probes wrong:\n%s", len(wrong), len(sc.Probes()), strings.Join(wrong, "\n"))
			}
		})
	}
}

// TestHostAlwaysAllowed: the node's own address reaches a pod that is
// isolated for ingress.
func TestHostAlwaysAllowed(t *testing.T) {
	a := addressing()
	sc := netpoltest.Scenarios()[1] // deny-ingress-x
	set := parse(t, &sc, a)
	tables, err := policy.Compile(set, nil)
	if err != nil {
		t.Fatal(err)
	}
	host := netip.MustParseAddr("198.18.1.1")
	xa := a.IPs[netpoltest.Pod{NS: "x", Name: "a"}]
	if v := set.Decide(policy.Endpoint{Addr: host}, set.Endpoint(xa), 80, policy.TCP); !v.Allowed {
		t.Errorf("host to x/a: %s", v)
	}
	if !(kernel{tables}).judge(0, host, xa, 80, policy.TCP) {
		t.Error("tables deny the host")
	}
	other := netip.MustParseAddr("198.18.2.9")
	if v := set.Decide(policy.Endpoint{Addr: other}, set.Endpoint(xa), 80, policy.TCP); v.Allowed {
		t.Errorf("a remote address to x/a: %s", v)
	}
	if (kernel{tables}).judge(0, other, xa, 80, policy.TCP) {
		t.Error("tables allow a remote address")
	}
}

func TestPortBlocksViaRange(t *testing.T) {
	src := `
pods:
  - {namespace: x, name: a, labels: {app: a}, ips: [198.18.1.2], cgroup: a}
policies:
  - metadata: {name: r, namespace: x}
    spec:
      podSelector: {}
      ingress: [{ports: [{port: 1000, endPort: 2000}]}]
`
	set, err := policy.Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	set.Pods[0].CgroupID = 7
	tables, err := policy.Compile(set, nil)
	if err != nil {
		t.Fatal(err)
	}
	k := kernel{tables}
	xa := netip.MustParseAddr("198.18.1.2")
	from := netip.MustParseAddr("198.18.2.2")
	for port := 1; port < 65536; port += 1 {
		want := port >= 1000 && port <= 2000
		if got := k.judge(0, from, xa, uint16(port), policy.TCP); got != want {
			t.Fatalf("port %d: got %v want %v", port, got, want)
		}
	}
	if len(tables.Rules) > 20 {
		t.Errorf("%d rule entries for one range: want the aligned blocks only", len(tables.Rules))
	}
}
