package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/socklane/socklane/internal/peer"
	"github.com/socklane/socklane/internal/testutil"
)

// TestServiceLBEdgeCases: one unconnected UDP socket talking to VIPs
// whose backends coincide, or to more VIPs than it keeps translations
// for, gets every reply from the VIP it asked; a connect racing an apply
// is never refused when both sets have backends.
func TestServiceLBEdgeCases(t *testing.T) {
	lb := newLBBed(t)
	be0, be1 := lb.back[0], lb.back[1]
	// Forty more (backend, port) pairs: ports 9001-9020 on both.
	for _, p := range lb.back {
		start(t, p, lb.in.Bin, "peer", "whoami", "::", "--network", "udp", "--ports", "9001-9020", "--label", p.Name)
		waitUDPPort(t, p, "[::]:9020")
	}
	var y strings.Builder
	y.WriteString("services:\n")
	svc := func(name, vip string, port uint16, backends ...netip.Addr) {
		fmt.Fprintf(&y, "  - name: %s\n    vips: [%s]\n    ports: [{port: 53, protocol: UDP, targetPort: %d}]\n    backends:\n", name, vip, port)
		for _, b := range backends {
			fmt.Fprintf(&y, "      - {ip: %s}\n", b)
		}
	}
	svc("pair-a", "198.19.0.20", 8080, be0.IPv4, be1.IPv4)
	svc("pair-b", "198.19.0.21", 8080, be0.IPv4, be1.IPv4)
	svc("solo-a", "198.19.0.22", 8080, be0.IPv4)
	svc("solo-b", "198.19.0.23", 8080, be0.IPv4)
	var many []string
	for i := range 40 {
		vip := netip.AddrFrom4([4]byte{198, 19, 1, byte(i + 1)})
		svc(fmt.Sprintf("many-%d", i), vip.String(), uint16(9001+i%20), lb.back[i/20].IPv4)
		many = append(many, netip.AddrPortFrom(vip, 53).String())
	}
	lb.apply(t, y.String())

	t.Run("two VIPs sharing backends, in bursts", func(t *testing.T) {
		// Each socket keeps the backend it was given per VIP: without
		// care, half of the sockets would get one backend for both.
		before := lb.lbCounters(t)
		for i := range 8 {
			r := lb.fanout(t, true, 20, "198.19.0.20:53", "198.19.0.21:53")
			if r.Replies != 40 || r.WrongSource != 0 {
				t.Fatalf("socket %d: %+v", i, r)
			}
		}
		mustEqual(t, testutil.Delta(before, lb.lbCounters(t)), "pick_ambiguous", 0)
	})
	t.Run("two VIPs with the same only backend, request by request", func(t *testing.T) {
		// Replies cannot be told apart; the VIP sent to last answers.
		before := lb.lbCounters(t)
		r := lb.fanout(t, false, 20, "198.19.0.22:53", "198.19.0.23:53")
		if r.Replies != 40 || r.WrongSource != 0 {
			t.Fatalf("%+v", r)
		}
		mustAtLeast(t, testutil.Delta(before, lb.lbCounters(t)), "pick_ambiguous", 1)
	})
	t.Run("twenty VIPs, in bursts", func(t *testing.T) {
		before := lb.lbCounters(t)
		r := lb.fanout(t, true, 5, many[:20]...)
		if r.Replies != 100 || r.WrongSource != 0 {
			t.Fatalf("%+v", r)
		}
		mustEqual(t, testutil.Delta(before, lb.lbCounters(t)), "nat_evicted", 0)
	})
	t.Run("forty VIPs: past the socket's translations, request by request", func(t *testing.T) {
		// Over 32 VIPs the least recently used translation goes, and
		// is counted; request by request every reply still maps back.
		before := lb.lbCounters(t)
		r := lb.fanout(t, false, 3, many...)
		if r.Replies != 120 || r.WrongSource != 0 {
			t.Fatalf("%+v", r)
		}
		mustAtLeast(t, testutil.Delta(before, lb.lbCounters(t)), "nat_evicted", 8)
	})

	t.Run("connect racing applies", func(t *testing.T) {
		// The kernel matrix runs -test.short: 1,000 connects race the
		// applies there (10,000 take four minutes emulated).
		connects := 10000
		if testing.Short() {
			connects = 1000
		}
		race := func(b netip.Addr) string {
			return fmt.Sprintf("services:\n  - name: race\n    vips: [198.19.0.30]\n    ports: [{port: 80, targetPort: 8080}]\n    backends: [{ip: %s}]\n", b)
		}
		lb.apply(t, race(be0.IPv4))
		before := lb.lbCounters(t)
		done := make(chan *peer.LBProbe, 1)
		go func() {
			cmd, err := lb.client.Command(lb.in.Bin, "peer", "lbprobe", "198.19.0.30:80", "--mode", "tcp", "--count", strconv.Itoa(connects))
			if err != nil {
				done <- nil
				return
			}
			out, _ := cmd.Output()
			var r peer.LBProbe
			_ = json.Unmarshal(out, &r)
			done <- &r
		}()
		applies := 0
		for running := true; running; applies++ {
			select {
			case r := <-done:
				running = false
				// A connection whose backend an apply removed between
				// its connect and its reply is destroyed, as a removed
				// backend's sockets are (ECONNABORTED); every other
				// connect is answered.
				if r == nil {
					t.Errorf("lbprobe during %d applies gave no report", applies)
					break
				}
				aborted := r.Errors["ECONNABORTED"]
				if len(r.Errors) != min(aborted, 1) || r.Replies["be0"]+r.Replies["be1"]+aborted != connects || aborted > connects/100 {
					t.Errorf("connects during %d applies: %+v", applies, r)
				}
			default:
				lb.apply(t, race([]netip.Addr{be1.IPv4, be0.IPv4}[applies%2]))
			}
		}
		d := testutil.Delta(before, lb.lbCounters(t))
		t.Logf("%d applies during %d connects: %v", applies, connects, d)
		mustEqual(t, d, "no_backend", 0)
		// Kernel evidence: the bank the last apply left is still there
		// beside the live one (one slot each).
		n := lb.in.MapEntries("sl_svc_backends")
		if n != 2 {
			t.Errorf("sl_svc_backends holds %d slots after alternating applies of one backend, want 2 (live and previous bank)", n)
		}
	})
}

// fanout runs `peer fanout` from the bed's client pod.
func (lb *lbBed) fanout(t *testing.T, burst bool, rounds int, targets ...string) *peer.FanoutReport {
	t.Helper()
	args := append([]string{"peer", "fanout", "--rounds", fmt.Sprint(rounds)}, targets...)
	if burst {
		args = append(args, "--burst")
	}
	cmd, err := lb.client.Command(lb.in.Bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("fanout: %v: %s", err, out)
	}
	var r peer.FanoutReport
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("parsing %q: %v", out, err)
	}
	return &r
}
