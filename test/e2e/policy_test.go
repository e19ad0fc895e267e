package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/peer"
	"github.com/socklane/socklane/internal/policy/netpoltest"
	"github.com/socklane/socklane/internal/testbed"
	"github.com/socklane/socklane/internal/testutil"
)

// policyBed is the truth table's nine pods (namespaces x, y, z; pods a,
// b, c), each serving its name on ports 80 and 81 over TCP and UDP and on
// 53 over UDP, all attached.
type policyBed struct {
	in   *testutil.Instance
	bed  *testbed.Bed
	pods map[netpoltest.Pod]*testbed.Pod
	dir  string
}

func newPolicyBed(t *testing.T, settings ...string) *policyBed {
	t.Helper()
	pb := &policyBed{in: testutil.NewInstance(t), bed: testutil.Bed(t), pods: map[netpoltest.Pod]*testbed.Pod{}, dir: t.TempDir()}
	pb.in.Settings = append(pb.in.Settings, settings...)
	var all []*testbed.Pod
	for _, p := range netpoltest.Pods() {
		tp := testutil.Pod(t, pb.bed, p.NS+p.Name)
		pb.pods[p] = tp
		all = append(all, tp)
		// Dual-stack servers: IPv4 clients arrive as IPv4-mapped
		// addresses, and the UDP answers leave through sendmsg6.
		start(t, tp, pb.in.Bin, "peer", "whoami", "::", "--ports", "80-81", "--label", p.String())
		start(t, tp, pb.in.Bin, "peer", "whoami", "::", "--ports", "80-81", "--network", "udp", "--label", p.String())
		start(t, tp, pb.in.Bin, "peer", "whoami", "[::]:53", "--network", "udp", "--label", p.String())
	}
	for _, tp := range all {
		waitPort(t, tp, "[::]:81")
		waitUDPPort(t, tp, "[::]:53")
	}
	pb.in.Attach(all...)
	return pb
}

func (pb *policyBed) addressing() netpoltest.Addressing {
	a := netpoltest.Addressing{IPs: map[netpoltest.Pod]netip.Addr{}, IPv6: map[netpoltest.Pod]netip.Addr{}, Cgroups: map[netpoltest.Pod]string{}}
	for p, tp := range pb.pods {
		a.IPs[p], a.IPv6[p] = tp.IPv4, tp.IPv6
		a.Cgroups[p] = tp.Cgroup
	}
	return a
}

// apply writes a policy file and applies it.
func (pb *policyBed) apply(t *testing.T, src string) string {
	t.Helper()
	f := filepath.Join(pb.dir, "policies.yaml")
	if err := os.WriteFile(f, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return pb.in.MustRun("policy", "apply", "-f", f)
}

// reach probes targets from pod p.
func reach(t *testing.T, in *testutil.Instance, p *testbed.Pod, timeout time.Duration, targets []string) []peer.Reach {
	// targets may begin with flags of peer reach (--bind IP).
	t.Helper()
	out := run(t, p, 2*time.Minute, in.Bin, append([]string{"peer", "reach", "--timeout", timeout.String()}, targets...)...)
	var res []peer.Reach
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("parsing %q: %v", out, err)
	}
	return res
}

// TestPolicyTruthTable applies each scenario of the truth table through
// the YAML source and tries every pair of pods on each port: an allowed
// probe must reach the server it names, a denied one must fail with
// EPERM at once (both ends are pods of this node), and the connect-time
// denial counter must grow by exactly the denied probes. UDP probes are
// unconnected sends (sendmsg) in even scenarios, connected sockets in odd
// ones.
func TestPolicyTruthTable(t *testing.T) {
	pb := newPolicyBed(t)
	a := pb.addressing()
	for i, sc := range netpoltest.Scenarios() {
		// Emulated kernels (the kernel matrix runs -test.short) try three
		// scenarios that take every hook and table: both directions over
		// TCP and connected UDP, address prefixes with an exception over
		// unconnected UDP (replies), a named port on the peer.
		if testing.Short() && sc.Name != "deny-all-x" && sc.Name != "ipblock-except" && sc.Name != "egress-named-port" {
			continue
		}
		udp := "udpu"
		if i%2 == 1 {
			udp = "udp"
		}
		src, err := sc.File(a)
		if err != nil {
			t.Fatal(err)
		}
		pb.apply(t, src)
		pb.check(t, &sc, udp, false)
	}
}

// TestPolicyIPv6 runs scenarios of the truth table over the pods' IPv6
// addresses (connect6, sendmsg6, IPv6 first packets).
func TestPolicyIPv6(t *testing.T) {
	pb := newPolicyBed(t)
	a := pb.addressing()
	for _, sc := range netpoltest.Scenarios() {
		switch sc.Name {
		case "deny-all-x", "namespace-or-pod-selector", "port-80-tcp", "egress-named-port":
		default:
			continue
		}
		src, err := sc.File(a)
		if err != nil {
			t.Fatal(err)
		}
		pb.apply(t, src)
		pb.check(t, &sc, "udpu", true)
	}
}

// check tries every probe of the scenario (UDP over udp: "udp" connected
// or "udpu" unconnected) against the applied policies.
func (pb *policyBed) check(t *testing.T, sc *netpoltest.Scenario, udp string, v6 bool) {
	t.Helper()
	a := pb.addressing()
	addrs := a.IPs
	if v6 {
		addrs = a.IPv6
	}
	before := lbCountersOf(t, pb.in)
	byFrom := map[netpoltest.Pod][]netpoltest.Probe{}
	for _, pr := range sc.Probes() {
		byFrom[pr.From] = append(byFrom[pr.From], pr)
	}
	var wrong []string
	denied := 0
	for from, probes := range byFrom {
		var targets []string
		for _, pr := range probes {
			mode := pr.Proto
			if mode == "udp" {
				mode = udp
			}
			targets = append(targets, fmt.Sprintf("%s/%s", netip.AddrPortFrom(addrs[pr.To], pr.Port.Port), mode))
		}
		res := reach(t, pb.in, pb.pods[from], 2*time.Second, targets)
		for j, pr := range probes {
			want := sc.Allow(pr)
			r := res[j]
			switch {
			case want && (r.Result != "ok" || r.Label != pr.To.String()):
				wrong = append(wrong, fmt.Sprintf("%s -> %s %s: want allowed, got %s %q", pr.From, pr.To, pr.Port, r.Result, r.Label))
			case !want && r.Result != "EPERM":
				wrong = append(wrong, fmt.Sprintf("%s -> %s %s: want EPERM, got %s %q", pr.From, pr.To, pr.Port, r.Result, r.Label))
			}
			if !want {
				denied++
			}
		}
	}
	d := testutil.Delta(before, lbCountersOf(t, pb.in))
	if len(wrong) > 0 {
		t.Errorf("scenario %s (udp %s): %d of %d probes wrong:\n%s", sc.Name, udp, len(wrong), len(sc.Probes()), strings.Join(wrong, "\n"))
		return
	}
	if d["pol_denied_connect"] != uint64(denied) {
		t.Errorf("scenario %s: pol_denied_connect grew by %d, want %d (the denied probes)", sc.Name, d["pol_denied_connect"], denied)
	}
	t.Logf("scenario %s: %d probes, %d denied", sc.Name, len(sc.Probes()), denied)
}

// policyFile renders a scenario-style file: the nine pods and policies.
func (pb *policyBed) file(t *testing.T, policies string) string {
	t.Helper()
	sc := netpoltest.Scenario{Name: t.Name(), Policies: policies}
	src, err := sc.File(pb.addressing())
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func (pb *policyBed) pod(name string) *testbed.Pod {
	ns, n, _ := strings.Cut(name, "/")
	return pb.pods[netpoltest.Pod{NS: ns, Name: n}]
}

const denyIngressX = `
  - metadata: {name: deny-ingress, namespace: x}
    spec: {podSelector: {}}
`

// TestPolicyFirstPacket: clients this node does not manage (a pod of
// "another node": a network namespace outside the attached cgroups, and
// the node itself) are judged at the server's first packet. The remote
// client's SYN and first datagram are dropped (a timeout, as any CNI
// does), counted and reported with the policy; an ipBlock naming it lets
// it in; the node's own address is always let in. Established traffic
// into the pod is not judged again.
func TestPolicyFirstPacket(t *testing.T) {
	pb := newPolicyBed(t)
	remote := testutil.Pod(t, pb.bed, "remote") // not attached: another node's pod
	xa := pb.pod("x/a")
	targets := []string{xa.IPv4.String() + ":80/tcp", xa.IPv4.String() + ":80/udpu"}

	// An event reader, to see the denial reported with its policy.
	evCmd, evOut, _ := background(t, pb.in, "reading events", "events", "-o", "json", "--type", "policy_denied")
	_ = evCmd
	// Without a policy no attached pod runs the packet hook.
	pb.checkPacketHooks(t)
	pb.apply(t, pb.file(t, denyIngressX))
	// Ingress isolation anywhere puts it on every pod: any of them may
	// answer a datagram from an isolated pod.
	pb.checkPacketHooks(t, "x/a", "x/b", "x/c", "y/a", "y/b", "y/c", "z/a", "z/b", "z/c")
	before := lbCountersOf(t, pb.in)
	res := reach(t, pb.in, remote, time.Second, targets)
	for _, r := range res {
		if r.Result != "timeout" {
			t.Errorf("remote %s under deny-ingress: %s %q, want a timeout (first packet dropped)", r.Target, r.Result, r.Label)
		}
	}
	d := testutil.Delta(before, lbCountersOf(t, pb.in))
	// TCP retransmits its SYN within the second: at least one each.
	if d["pol_denied_packet"] < 2 || d["pol_first_packet"] < 2 {
		t.Errorf("pol_denied_packet +%d, pol_first_packet +%d: want at least the SYN and the datagram", d["pol_denied_packet"], d["pol_first_packet"])
	}
	ev := readEvent(t, evOut)
	if ev.Type != "policy_denied" || ev.PolicyName != "x/deny-ingress" || ev.Dir != "ingress" || ev.Src.Addr() != remote.IPv4 || ev.Dst.Addr() != xa.IPv4 || ev.DstIdentity < 256 || ev.SrcIdentity != 0 {
		t.Errorf("denial event %+v: want policy x/deny-ingress, ingress, %s (world) -> %s (a pod identity)", ev, remote.IPv4, xa.IPv4)
	}

	// The node's own address is let in (the bed's gateway, from a
	// process of the host that socklane does not manage).
	host, err := exec.Command(pb.in.Bin, "peer", "reach", "--timeout", "2s", targets[0]).Output()
	if err != nil || !strings.Contains(string(host), `"result":"ok"`) {
		t.Errorf("the node to x/a under deny-ingress: %s %v, want ok", host, err)
	}

	// An ipBlock naming the remote client lets it in.
	pb.apply(t, pb.file(t, `
  - metadata: {name: from-remote, namespace: x}
    spec:
      podSelector: {}
      ingress: [{from: [{ipBlock: {cidr: "`+remote.IPv4.String()+`/32"}}]}]
`))
	for _, r := range reach(t, pb.in, remote, 2*time.Second, targets) {
		if r.Result != "ok" || r.Label != "x/a" {
			t.Errorf("remote %s allowed by ipBlock: %s %q", r.Target, r.Result, r.Label)
		}
	}
	// A stream of established traffic is judged at its SYN only.
	start(t, xa, pb.in.Bin, "peer", "sink", "0.0.0.0:90")
	waitPort(t, xa, "0.0.0.0:90")
	before = lbCountersOf(t, pb.in)
	run(t, remote, time.Minute, pb.in.Bin, "peer", "stream", xa.IPv4.String()+":90", "--size", "16384", "--count", "256")
	d = testutil.Delta(before, lbCountersOf(t, pb.in))
	if d["pol_first_packet"] != 1 {
		t.Errorf("pol_first_packet +%d for one 4 MiB TCP stream: want 1 (its SYN)", d["pol_first_packet"])
	}
	// With egress isolation only, only the isolated pod gets the hook
	// (its UDP answers are let out by the exchanges the hook records);
	// with no policy left, no pod has it.
	pb.apply(t, pb.file(t, `
  - metadata: {name: deny-egress, namespace: y}
    spec: {podSelector: {matchLabels: {pod: b}}, policyTypes: [Egress]}
`))
	pb.checkPacketHooks(t, "y/b")
	pb.apply(t, pb.file(t, ""))
	pb.checkPacketHooks(t)
}

// checkPacketHooks checks, from the kernel's list of each pod cgroup's
// programs, that the policy's packet hook (cgroup_skb ingress) is attached
// to exactly the pods named.
func (pb *policyBed) checkPacketHooks(t *testing.T, hooked ...string) {
	t.Helper()
	for p, tp := range pb.pods {
		want := 0
		if slices.Contains(hooked, p.String()) {
			want = 1
		}
		if n := testutil.AttachedCount(t, tp.Cgroup, ebpf.AttachCGroupInetIngress); n != want {
			t.Errorf("pod %s: %d cgroup_skb ingress programs attached, want %d (hooked pods: %v)", p, n, want, hooked)
		}
	}
}

// readEvent reads one JSON event line within 10 s.
func readEvent(t *testing.T, r io.Reader) datapath.Event {
	t.Helper()
	ch := make(chan datapath.Event, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			var e datapath.Event
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				ch <- e
				return
			}
		}
	}()
	select {
	case e := <-ch:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no event in 10s")
		return datapath.Event{}
	}
}

// TestPolicyLiveConnections: a policy change reaches established
// connections. A bypassed TCP connection and a connected UDP socket that
// the new policy denies are destroyed (both ends on this node); those it
// still allows stay open.
func TestPolicyLiveConnections(t *testing.T) {
	pb := newPolicyBed(t)
	pb.apply(t, pb.file(t, ""))
	xa, ya := pb.pod("x/a"), pb.pod("y/a")
	doomed := startHold(t, pb.in, pb.pod("y/b"), 2, xa.IPv4.String()+":80")
	doomedUDP := startHold(t, pb.in, pb.pod("y/b"), 2, "--mode", "udp", xa.IPv4.String()+":81")
	kept := startHold(t, pb.in, pb.pod("x/b"), 2, ya.IPv4.String()+":80")
	if n := pb.in.Sockets(); n < 8 {
		t.Fatalf("%d sockets in the bypass map: want the held TCP connections bypassed (8 ends at least)", n)
	}
	out := pb.apply(t, pb.file(t, `
  - metadata: {name: only-from-x, namespace: x}
    spec:
      podSelector: {}
      ingress: [{from: [{podSelector: {}}]}]
`))
	if !strings.Contains(out, "established connections destroyed") {
		t.Fatalf("apply output: %s", out)
	}
	for name, h := range map[string]*holder{"bypassed TCP": doomed, "connected UDP": doomedUDP} {
		if got := h.closed(t, 2, 0); len(got) != 2 {
			t.Errorf("%s sockets y/b -> x/a closed: %v, want both (denied now)", name, got)
		}
	}
	if got := kept.closed(t, 0, time.Second); len(got) != 0 {
		t.Errorf("x/b -> y/a (still allowed) closed: %v", got)
	}
	// New connections follow the policy at once.
	if r := reach(t, pb.in, pb.pod("y/b"), time.Second, []string{xa.IPv4.String() + ":80/tcp"}); r[0].Result != "EPERM" {
		t.Errorf("a new y/b -> x/a connection: %s", r[0].Result)
	}
}

// TestPolicyServiceEgress: egress to a Service is judged after the load
// balancer's choice, against the backend actually chosen (as Kubernetes
// has it): with backends in y and z and x/a allowed only to y, a connect
// to the VIP succeeds exactly when y's backend is chosen.
func TestPolicyServiceEgress(t *testing.T) {
	pb := newPolicyBed(t)
	ya, za := pb.pod("y/a"), pb.pod("z/a")
	vip := fmt.Sprintf("198.19.%d.10", pb.bed.Index)
	svc := fmt.Sprintf(`services:
  - name: web
    namespace: y
    vips: [%s]
    ports: [{port: 80, protocol: TCP, targetPort: 80}]
    backends: [{ip: %s}, {ip: %s}]
`, vip, ya.IPv4, za.IPv4)
	f := filepath.Join(pb.dir, "services.yaml")
	if err := os.WriteFile(f, []byte(svc), 0o644); err != nil {
		t.Fatal(err)
	}
	pb.in.MustRun("svc", "apply", "-f", f)
	pb.apply(t, pb.file(t, `
  - metadata: {name: to-y, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      policyTypes: [Egress]
      egress: [{to: [{namespaceSelector: {matchLabels: {ns: y}}}]}]
`))
	var targets []string
	for range 40 {
		targets = append(targets, vip+":80/tcp")
	}
	got := map[string]int{}
	for _, r := range reach(t, pb.in, pb.pod("x/a"), 2*time.Second, targets) {
		got[r.Result+" "+r.Label]++
	}
	if got["ok y/a"] == 0 || got["EPERM "] == 0 || got["ok y/a"]+got["EPERM "] != 40 {
		t.Errorf("40 connects to the VIP from x/a (allowed to y only): %v; want y/a reached and z/a refused with EPERM, nothing else", got)
	}
	// Another pod of x is not isolated: both backends answer.
	got = map[string]int{}
	for _, r := range reach(t, pb.in, pb.pod("x/b"), 2*time.Second, targets) {
		got[r.Result+" "+r.Label]++
	}
	if got["ok y/a"] == 0 || got["ok z/a"] == 0 {
		t.Errorf("40 connects to the VIP from x/b: %v; want both backends", got)
	}
}

// TestPolicyBadInput: a policy file with problems is refused whole, each
// problem named by line and field, and the applied policies stay.
func TestPolicyBadInput(t *testing.T) {
	pb := newPolicyBed(t)
	pb.apply(t, pb.file(t, denyIngressX))
	good := pb.in.MustRun("policy", "list", "-o", "json")
	for _, tc := range []struct {
		name, policies string
		want           []string
	}{
		{"unknown field", `
  - metadata: {name: p, namespace: x}
    spec: {podSelector: {}, ingres: []}
`, []string{"field ingres not found"}},
		{"bad CIDR and except", `
  - metadata: {name: p, namespace: x}
    spec:
      podSelector: {}
      ingress: [{from: [{ipBlock: {cidr: 198.18.0.0/33, except: [10.0.0.0/8]}}]}]
`, []string{"spec.ingress[0].from[0].ipBlock.cidr", "is not a CIDR"}},
		{"except outside the CIDR", `
  - metadata: {name: p, namespace: x}
    spec:
      podSelector: {}
      ingress: [{from: [{ipBlock: {cidr: 198.18.0.0/16, except: [198.19.0.0/24]}}]}]
`, []string{"policies[0].spec.ingress[0].from[0].ipBlock.except[0]", "not strictly inside"}},
		{"port range backwards", `
  - metadata: {name: p, namespace: x}
    spec:
      podSelector: {}
      ingress: [{ports: [{port: 81, endPort: 80}]}]
`, []string{"policies[0].spec.ingress[0].ports[0].endPort", "want from port (81)"}},
		{"port out of range and SCTP", `
  - metadata: {name: p, namespace: x}
    spec:
      podSelector: {}
      egress: [{ports: [{port: 70000}, {protocol: SCTP, port: 80}]}]
`, []string{"ports[0].port: 70000", "ports[1].protocol: protocol SCTP is not enforced"}},
		{"bad selector operator", `
  - metadata: {name: p, namespace: x}
    spec:
      podSelector: {matchExpressions: [{key: pod, operator: Near, values: [a]}]}
`, []string{"policies[0].spec.podSelector", "Near"}},
	} {
		f := filepath.Join(pb.dir, "bad.yaml")
		if err := os.WriteFile(f, []byte(pb.file(t, tc.policies)), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := pb.in.Run("policy", "apply", "-f", f)
		if err == nil {
			t.Errorf("%s: applied: %s", tc.name, out)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: error %q does not say %q", tc.name, out, w)
			}
		}
		if tc.name != "unknown field" && !strings.Contains(out, "line ") {
			t.Errorf("%s: error %q names no line", tc.name, out)
		}
		if now := pb.in.MustRun("policy", "list", "-o", "json"); now != good {
			t.Errorf("%s: the applied policies changed:\n%s\nwas:\n%s", tc.name, now, good)
		}
	}
	// And the datapath still enforces the good set.
	if r := reach(t, pb.in, pb.pod("y/a"), time.Second, []string{pb.pod("x/a").IPv4.String() + ":80/tcp"}); r[0].Result != "EPERM" {
		t.Errorf("y/a -> x/a after refused applies: %s, want EPERM (deny-ingress still applies)", r[0].Result)
	}
}

// TestPolicyCLI: `policy test` explains a verdict by its rule, `policy
// list` counts verdicts per policy, `policy get` shows the object.
func TestPolicyCLI(t *testing.T) {
	pb := newPolicyBed(t)
	pb.apply(t, pb.file(t, `
  - metadata: {name: from-y, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}], ports: [{port: 80}]}]
`))
	for _, tc := range []struct{ from, to, want string }{
		{"y/b", "x/a:80/TCP", "allowed: ingress rule 0 of x/from-y allows it"},
		{"z/b", "x/a:80/TCP", "denied: x/a is isolated for ingress by x/from-y and no rule allows it"},
		{"y/b", "x/a:81/TCP", "denied: x/a is isolated for ingress"},
		{"z/b", "x/b:80/UDP", "allowed: no policy isolates either end"},
		{pb.pod("y/c").IPv4.String(), "x/a:80/TCP", "allowed: ingress rule 0 of x/from-y"},
	} {
		out := pb.in.MustRun("policy", "test", "--from", tc.from, "--to", tc.to)
		if !strings.Contains(out, tc.want) {
			t.Errorf("policy test %s -> %s: %q, want %q", tc.from, tc.to, out, tc.want)
		}
	}
	if out, err := pb.in.Run("policy", "test", "--from", "q/q", "--to", "x/a:80/TCP"); err == nil || !strings.Contains(out, "no applied pod") {
		t.Errorf("policy test from an unknown pod: %v %s", err, out)
	}
	xa := pb.pod("x/a").IPv4.String()
	reach(t, pb.in, pb.pod("y/b"), time.Second, []string{xa + ":80/tcp", xa + ":81/tcp"})
	var list struct {
		Policies []struct {
			Name    string   `json:"name"`
			Allowed uint64   `json:"allowed"`
			Denied  uint64   `json:"denied"`
			Selects []string `json:"selects"`
		} `json:"policies"`
	}
	if err := json.Unmarshal([]byte(pb.in.MustRun("policy", "list", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Policies) != 1 || list.Policies[0].Allowed < 1 || list.Policies[0].Denied != 1 || len(list.Policies[0].Selects) != 1 {
		t.Errorf("policy list: %+v; want from-y selecting x/a, at least 1 allowed and exactly 1 denied", list.Policies)
	}
	if out := pb.in.MustRun("policy", "get", "x/from-y"); !strings.Contains(out, "namespaceSelector") || !strings.Contains(out, "1 denied") {
		t.Errorf("policy get: %s", out)
	}
}
