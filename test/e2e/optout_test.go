package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/sockbugs"
	"github.com/socklane/socklane/internal/testutil"
)

// TestBypassOptOut: a pod whose program the bypass cannot serve is kept out
// of it. The program is a Go TCP proxy (io.Copy both ways between two TCP
// connections, which is splice(2), and splice reads only TCP's receive
// queue). Where the kernel's splice does not see redirected bytes (status:
// splice_blind), a ping-pong through the proxy with both hops bypassed
// stalls; with the proxy's pod opted out (`socklane bypass optout`), both
// hops stay on TCP, one as server and one as client (fallback_opted_out),
// and every round trip completes.
func TestBypassOptOut(t *testing.T) {
	// --bypass on: the kernels of the matrix include 6.1, where the
	// default leaves the bypass off.
	b, in, srv, cli := serverClient(t, "--bypass", "on")
	prx := testutil.Pod(t, b, "proxy")
	in.Attach(prx)
	start(t, srv, in.Bin, "peer", "echo", "0.0.0.0:7430")
	waitPort(t, srv, "0.0.0.0:7430")
	start(t, prx, in.Bin, "peer", "proxy", "0.0.0.0:7431", "--to", fmt.Sprintf("%s:7430", srv.IPv4))
	waitPort(t, prx, "0.0.0.0:7431")
	through := fmt.Sprintf("%s:7431", prx.IPv4)
	pingpong := func(count int) *proc {
		return start(t, cli, in.Bin, "peer", "pingpong", through, "--count", fmt.Sprint(count), "--warmup", "0", "--size", "64")
	}
	st := readStatus(t, in)
	if st.Settings.Bypass.On() && st.Kernel.Has(sockbugs.Splice) {
		before := in.Counters()
		p := pingpong(5)
		done := make(chan error, 1)
		go func() { done <- p.cmd.Wait() }()
		select {
		case err := <-done:
			t.Fatalf("a ping-pong through the bypassed proxy ended (%v) on a kernel whose splice(2) is blind to redirected bytes: %s", err, p.out.String())
		case <-time.After(3 * time.Second):
			_ = p.cmd.Process.Kill()
			t.Logf("the stalled ping-pong killed: %v", <-done)
		}
		mustAtLeast(t, testutil.Delta(before, in.Counters()), "conns_bypassed", 1)
		t.Log("through the bypassed proxy the ping-pong stalled: splice(2) never saw the redirected request")
	}

	if out := in.MustRun("bypass", "optout", prx.NetNS); !strings.Contains(out, "kept out of the bypass") {
		t.Fatalf("bypass optout said %q", out)
	}
	var list struct {
		Netns []uint64 `json:"netns"`
	}
	if err := json.Unmarshal([]byte(in.MustRun("bypass", "optout", "-o", "json")), &list); err != nil || len(list.Netns) != 1 {
		t.Fatalf("opted-out namespaces: %+v (%v)", list, err)
	}
	before := in.Counters()
	p := pingpong(200)
	if err := p.wait(t, time.Minute); err != nil {
		t.Fatalf("ping-pong through the opted-out proxy: %v: %s", err, p.err.String())
	}
	d := testutil.Delta(before, in.Counters())
	// Client to proxy: the proxy's end, a server, is opted out; proxy to
	// echo: the proxy's end, a client, is.
	mustEqual(t, d, "fallback_opted_out", 2)
	mustEqual(t, d, "conns_bypassed", 0)

	// Opted back in, the proxy's pod's own connections are bypassed again.
	in.MustRun("bypass", "optout", "--undo", prx.NetNS)
	if err := json.Unmarshal([]byte(in.MustRun("bypass", "optout", "-o", "json")), &list); err != nil || len(list.Netns) != 0 {
		t.Fatalf("opted-out namespaces after --undo: %+v (%v)", list, err)
	}
	before = in.Counters()
	direct := start(t, prx, in.Bin, "peer", "pingpong", fmt.Sprintf("%s:7430", srv.IPv4), "--count", "200", "--warmup", "0", "--size", "64")
	if err := direct.wait(t, time.Minute); err != nil {
		t.Fatalf("ping-pong from the proxy's pod opted back in: %v: %s", err, direct.err.String())
	}
	d = testutil.Delta(before, in.Counters())
	mustEqual(t, d, "fallback_opted_out", 0)
	mustEqual(t, d, "conns_bypassed", 1)
}
