package e2e

import (
	"encoding/json"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/peer"
	"github.com/socklane/socklane/internal/testbed"
	"github.com/socklane/socklane/internal/testutil"
)

// TestFastOpenOrder: clients that send their first write in the SYN (TCP
// Fast Open without a cookie). Whether the server takes the SYN's data or
// not (then the client sends it again over TCP after the handshake), those
// bytes went through TCP, so the connection must stay there: redirecting
// the second write would put it ahead of the first in the server's reads.
func TestFastOpenOrder(t *testing.T) {
	tests := []struct {
		name     string
		fastOpen int // the server's TCP_FASTOPEN queue; 0: it takes no SYN data
		sysctl   string
	}{
		{"server takes no SYN data", 0, "1"},
		{"server takes SYN data", 16, strconv.Itoa(0x1 | 0x2 | 0x200)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := testutil.Bed(t)
			in := testutil.NewInstance(t)
			srv, cli := testutil.Pod(t, b, "server"), testutil.Pod(t, b, "client")
			for _, p := range []*testbed.Pod{srv, cli} {
				sysctl(t, p, "net.ipv4.tcp_fastopen", tt.sysctl)
			}
			in.Attach(srv, cli)
			start(t, srv, in.Bin, "peer", "echo", "--fastopen", strconv.Itoa(tt.fastOpen), "0.0.0.0:9000")
			waitPort(t, srv, "0.0.0.0:9000")
			before := in.Counters()
			c := start(t, cli, in.Bin, "peer", "fastopen", "--conns", "20", netip.AddrPortFrom(srv.IPv4, 9000).String())
			if err := c.wait(t, time.Minute); err != nil {
				t.Fatalf("fastopen client: %v: %s", err, c.err.String())
			}
			var rep peer.FastOpenReport
			if err := json.Unmarshal(c.out.Bytes(), &rep); err != nil {
				t.Fatalf("client report: %v: %s", err, c.out.String())
			}
			d := testutil.Delta(before, in.Counters())
			t.Logf("%+v; counters %s", rep, nonzero(d))
			if rep.OK != rep.Conns {
				t.Errorf("%d of %d connections echoed in order; failures: %v", rep.OK, rep.Conns, rep.Failed)
			}
			// Kernel evidence: every client had sent data with its SYN
			// and was left on TCP at establishment.
			mustAtLeast(t, d, "fallback_early_data", 20)
			mustEqual(t, d, "conns_bypassed", 0)
			mustEqual(t, d, "redirect_msgs", 0)
		})
	}
}

// sysctl sets a network namespace's sysctl for a pod.
func sysctl(t *testing.T, p *testbed.Pod, key, value string) {
	t.Helper()
	cmd, err := p.Command("sysctl", "-qw", key+"="+value)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sysctl %s=%s in %s: %v: %s", key, value, p.Name, err, out)
	}
}
