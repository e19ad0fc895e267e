package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

func newPolicyBed(t *testing.T) *policyBed {
	t.Helper()
	pb := &policyBed{in: testutil.NewInstance(t), bed: testutil.Bed(t), pods: map[netpoltest.Pod]*testbed.Pod{}, dir: t.TempDir()}
	var all []*testbed.Pod
	for _, p := range netpoltest.Pods() {
		tp := testutil.Pod(t, pb.bed, p.NS+p.Name)
		pb.pods[p] = tp
		all = append(all, tp)
		start(t, tp, pb.in.Bin, "peer", "whoami", "0.0.0.0", "--ports", "80-81", "--label", p.String())
		start(t, tp, pb.in.Bin, "peer", "whoami", "0.0.0.0", "--ports", "80-81", "--network", "udp", "--label", p.String())
		start(t, tp, pb.in.Bin, "peer", "whoami", "0.0.0.0:53", "--network", "udp", "--label", p.String())
	}
	for _, tp := range all {
		waitPort(t, tp, "0.0.0.0:81")
		waitUDPPort(t, tp, "0.0.0.0:53")
	}
	pb.in.Attach(all...)
	return pb
}

func (pb *policyBed) addressing() netpoltest.Addressing {
	a := netpoltest.Addressing{IPs: map[netpoltest.Pod]netip.Addr{}, Cgroups: map[netpoltest.Pod]string{}}
	for p, tp := range pb.pods {
		a.IPs[p] = tp.IPv4
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
		udp := "udpu"
		if i%2 == 1 {
			udp = "udp"
		}
		src, err := sc.File(a)
		if err != nil {
			t.Fatal(err)
		}
		pb.apply(t, src)
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
				targets = append(targets, fmt.Sprintf("%s:%d/%s", a.IPs[pr.To], pr.Port.Port, mode))
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
			continue
		}
		if d["pol_denied_connect"] != uint64(denied) {
			t.Errorf("scenario %s: pol_denied_connect grew by %d, want %d (the denied probes)", sc.Name, d["pol_denied_connect"], denied)
		}
		t.Logf("scenario %s: %d probes, %d denied", sc.Name, len(sc.Probes()), denied)
	}
}
