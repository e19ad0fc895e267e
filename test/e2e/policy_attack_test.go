package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/peer"
	"github.com/socklane/socklane/internal/testbed"
)

// TestPolicySpoofedSource: a pod that owns its network namespace gives
// itself the address of a pod the policy lets in and connects from it.
// The connect is judged by the pod the process belongs to (its cgroup),
// not by the address it chose: refused with EPERM; the same pod's
// datagrams from the borrowed address are refused too.
func TestPolicySpoofedSource(t *testing.T) {
	pb := newPolicyBed(t)
	pb.apply(t, pb.file(t, `
  - metadata: {name: from-b, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}]}]
`))
	attacker, xb := pb.pod("z/c"), pb.pod("x/b")
	run(t, attacker, time.Minute, "ip", "addr", "add", xb.IPv4.String()+"/32", "dev", "eth0")
	xa := pb.pod("x/a").IPv4.String()
	targets := []string{xa + ":80/tcp", xa + ":80/udp", xa + ":80/udpu"}
	for _, r := range reach(t, pb.in, attacker, time.Second, append([]string{"--bind", xb.IPv4.String()}, targets...)) {
		if r.Result != "EPERM" {
			t.Errorf("z/c posing as x/b -> %s: %s %q, want EPERM", r.Target, r.Result, r.Label)
		}
	}
	// The real x/b is let in (the borrowed address given back first: two
	// owners would confuse the bridge's neighbours).
	run(t, attacker, time.Minute, "ip", "addr", "del", xb.IPv4.String()+"/32", "dev", "eth0")
	run(t, pb.pod("x/a"), time.Minute, "ip", "neigh", "flush", "all")
	for _, r := range reach(t, pb.in, xb, 2*time.Second, targets) {
		if r.Result != "ok" || r.Label != "x/a" {
			t.Errorf("x/b -> %s: %s %q", r.Target, r.Result, r.Label)
		}
	}
}

// closedXZ isolates namespaces x and z for ingress and lets nothing in:
// only answers to what their pods sent pass.
const closedXZ = `
  - metadata: {name: closed, namespace: x}
    spec:
      podSelector: {}
      ingress: [{from: [{podSelector: {matchLabels: {pod: nobody}}}]}]
  - metadata: {name: closed, namespace: z}
    spec:
      podSelector: {}
      ingress: [{from: [{podSelector: {matchLabels: {pod: nobody}}}]}]
`

// lateExchange has x/a send one unconnected datagram to y/b, which answers
// delay later (labelled "late"); wantLateAnswer checks the answer came.
func (pb *policyBed) lateExchange(t *testing.T, delay string) *proc {
	t.Helper()
	yb := pb.pod("y/b")
	start(t, yb, pb.in.Bin, "peer", "whoami", "[::]:90", "--network", "udp", "--delay", delay, "--label", "late")
	waitUDPPort(t, yb, "[::]:90")
	return start(t, pb.pod("x/a"), pb.in.Bin, "peer", "reach", "--timeout", "10s", yb.IPv4.String()+":90/udpu")
}

func wantLateAnswer(t *testing.T, victim *proc, when string) {
	t.Helper()
	if err := victim.wait(t, 30*time.Second); err != nil {
		t.Fatalf("x/a's reach: %v: %s", err, victim.err.String())
	}
	var res []peer.Reach
	if err := json.Unmarshal(victim.out.Bytes(), &res); err != nil || len(res) != 1 {
		t.Fatalf("x/a's reach: %q: %v", victim.out.String(), err)
	}
	if res[0].Result != "ok" || res[0].Label != "late" {
		t.Errorf("x/a's answer from y/b %s: %s %q, want ok from late", when, res[0].Result, res[0].Label)
	}
}

// TestPolicyReplyFlood: a pod's unconnected UDP exchange keeps its answer
// while another pod makes 150,000 exchanges of its own. x/a and z/c are
// isolated for ingress and let nothing in, so only answers to what they
// sent pass; y/b answers x/a three seconds late, and meanwhile z/c sends
// to 150,000 (address, port) pairs from one socket. Each socket keeps its
// own exchanges: z/c can only push out its own (a table shared by the
// node's sockets would have lost x/a's). Then a busy server keeps every
// answer of more exchanges than its socket's table holds, in an overflow
// table of its own: z/c's overflow, in z/c's, cannot push them out (a
// node-wide overflow LRU that z/c had filled lost one of 160 at times).
func TestPolicyReplyFlood(t *testing.T) {
	pb := newPolicyBed(t)
	pb.apply(t, pb.file(t, closedXZ))
	xa, yb, zc := pb.pod("x/a"), pb.pod("y/b"), pb.pod("z/c")
	before := lbCountersOf(t, pb.in)["pol_replies"]
	victim := pb.lateExchange(t, "3s")
	time.Sleep(200 * time.Millisecond) // x/a's send is out: the exchange is recorded
	targets := []string{pb.pod("y/a").IPv4.String(), pb.pod("y/c").IPv4.String(), yb.IPv4.String()}
	flood := strings.TrimSpace(run(t, zc, time.Minute, pb.in.Bin, append([]string{"peer", "udpflood", "--ports", "1000-60999", "--count", "150000"}, targets...)...))
	if flood != "150000" {
		t.Fatalf("z/c sent %s datagrams, want 150000", flood)
	}
	wantLateAnswer(t, victim, "after z/c's 150,000 exchanges")
	if got := lbCountersOf(t, pb.in)["pol_replies"]; got <= before {
		t.Errorf("pol_replies %d -> %d: the answer was not let in as an answer", before, got)
	}

	// A busy server: x/a may send nothing (egress isolated) and lets y
	// in; its answers pass only as answers. 160 exchanges wait on one
	// socket at once, more than its table holds: the overflow moves to
	// the socket's overflow table and every answer still leaves.
	pb.apply(t, pb.file(t, `
  - metadata: {name: serve-y, namespace: x}
    spec:
      podSelector: {matchLabels: {pod: a}}
      policyTypes: [Ingress, Egress]
      ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}]}]
`))
	start(t, xa, pb.in.Bin, "peer", "whoami", "[::]:91", "--network", "udp", "--delay", "2s", "--label", "busy")
	waitUDPPort(t, xa, "[::]:91")
	busy := make([]string, 160)
	for i := range busy {
		busy[i] = xa.IPv4.String() + ":91/udpu"
	}
	counters := lbCountersOf(t, pb.in)
	spilled := counters["pol_replies_spilled"]
	ok := 0
	var missed []string
	for i, r := range reach(t, pb.in, yb, 10*time.Second, busy) {
		if r.Result == "ok" && r.Label == "busy" {
			ok++
		} else {
			missed = append(missed, fmt.Sprintf("%d: %s %q", i, r.Result, r.Label))
		}
	}
	if ok != len(busy) {
		// What the kernel says of the lost ones: refused by the policy,
		// or dropped by a full receive buffer (UDP RcvbufErrors of x/a
		// and y/b).
		now := lbCountersOf(t, pb.in)
		t.Errorf("y/b's %d exchanges with the busy x/a: %d answered; missed %v; pol_denied_connect +%d, pol_denied_packet +%d; x/a's %s; y/b's %s",
			len(busy), ok, missed, now["pol_denied_connect"]-counters["pol_denied_connect"], now["pol_denied_packet"]-counters["pol_denied_packet"],
			udpErrors(t, xa), udpErrors(t, yb))
	}
	if got := lbCountersOf(t, pb.in)["pol_replies_spilled"]; got <= spilled {
		t.Errorf("pol_replies_spilled %d -> %d: 160 live exchanges of one socket did not overflow its table", spilled, got)
	}
}

// TestPolicyReplyQuota: a pod's unconnected UDP sockets hold at most its
// quota of exchange tables (--owner-udp-tables), the socket storage each
// makes at its first exchange from an isolated pod and nobody else pays
// for. z/c opens three times its quota of sockets, each sending once: it
// holds its quota, the rest are refused (counted, and named by status),
// while x/a's exchange still gets its late answer; the tables come back
// when z/c's sockets close.
func TestPolicyReplyQuota(t *testing.T) {
	const quota = 24
	pb := newPolicyBed(t, "--owner-udp-tables", fmt.Sprint(quota))
	pb.apply(t, pb.file(t, closedXZ))
	yb, zc := pb.pod("y/b"), pb.pod("z/c")
	before := lbCountersOf(t, pb.in)
	victim := pb.lateExchange(t, "2s")
	sockets := 3 * quota
	flood, _ := backgroundIn(t, zc, fmt.Sprintf("%d\n", sockets), pb.in.Bin, "peer", "udpflood", "--ports", "90",
		"--count", fmt.Sprint(sockets), "--sockets", fmt.Sprint(sockets), "--hold", "60s", yb.IPv4.String())
	after := lbCountersOf(t, pb.in)
	if got := after["pol_replies_quota"] - before["pol_replies_quota"]; got < uint64(sockets-quota) {
		t.Errorf("pol_replies_quota +%d, want at least %d (z/c's sockets past its quota)", got, sockets-quota)
	}
	o := ownerOf(t, pb.in, zc)
	if o == nil || o.UDPTables != quota || o.RefusedUDPTables < uint64(sockets-quota) {
		t.Fatalf("status names z/c %+v, want it holding %d exchange tables, refused >= %d", o, quota, sockets-quota)
	}
	wantLateAnswer(t, victim, "while z/c is over its quota")
	// z/c's sockets close: its tables come back.
	_ = flood.Process.Kill()
	_ = flood.Wait()
	waitFor(t, func() bool { o := ownerOf(t, pb.in, zc); return o != nil && o.UDPTables == 0 })
}

// udpErrors is the Udp line of a pod's /proc/net/snmp (its network
// namespace's counters), with the names.
func udpErrors(t *testing.T, p *testbed.Pod) string {
	t.Helper()
	var names, values string
	for _, l := range strings.Split(run(t, p, 10*time.Second, "cat", "/proc/net/snmp"), "\n") {
		if strings.HasPrefix(l, "Udp: ") {
			if names == "" {
				names = l
			} else {
				values = l
			}
		}
	}
	return names + " / " + values
}
