package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/peer"
	"github.com/socklane/socklane/internal/testbed"
	"github.com/socklane/socklane/internal/testutil"
)

// TestBypassIntegrity moves many concurrent streams through the bypass in
// every scenario and checks each byte (SHA-256 against what was sent) and
// the kernel counters. The I/O is epoll-driven; see TestBlockingIO for
// blocking sockets. The slow receivers push their senders back onto TCP
// mid-stream: through the valve where the datapath loads it (the default
// where the kernel runs it), else past the backlog limit, which is low.
// The scenarios share one test bed and one datapath (each on a port of
// its own); a last one loads the other slow-reader rule where the kernel
// runs both, so the valve and the backlog rule are each proved.
func TestBypassIntegrity(t *testing.T) {
	b := testutil.Bed(t)
	in := testutil.NewInstance(t)
	flags := []string{"--backlog-limit", strconv.Itoa(*integrityBacklog), "--verdict-window", strconv.Itoa(*integrityWindow)}
	in.Settings = append(in.Settings, flags...)
	if *integrityReaders != "" {
		in.Settings = append(in.Settings, "--slow-readers", *integrityReaders)
	}
	srv, cli, host := testutil.Pod(t, b, "server"), testutil.Pod(t, b, "client"), testutil.HostPod(t, b, "host")
	in.Attach(srv, cli, host)
	valve := readStatus(t, in).Settings.BacklogValve.On()
	v4 := func(port int) (*testbed.Pod, string, string) {
		return cli, fmt.Sprintf("0.0.0.0:%d", port), netip.AddrPortFrom(srv.IPv4, uint16(port)).String()
	}
	tests := []struct {
		name  string
		setup func(port int) (client *testbed.Pod, listen, target string)
		extra []string
	}{
		{"pod to pod IPv4", v4, nil},
		{"pod to pod IPv6", func(port int) (*testbed.Pod, string, string) {
			return cli, fmt.Sprintf("[::]:%d", port), netip.AddrPortFrom(srv.IPv6, uint16(port)).String()
		}, nil},
		{"dual-stack server, IPv4 client", func(port int) (*testbed.Pod, string, string) {
			return cli, fmt.Sprintf("[::]:%d", port), netip.AddrPortFrom(srv.IPv4, uint16(port)).String()
		}, nil},
		{"host to pod", func(port int) (*testbed.Pod, string, string) {
			_, listen, target := v4(port)
			return host, listen, target
		}, nil},
		// Every write below the verdict window: most bytes move under a
		// verdict that covered earlier sends, across fallbacks and resets.
		{"small writes under verdict windows", v4, []string{"--max-msg", "2048"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, listen, target := tt.setup(9000 + i)
			integrityRun(t, in, srv, client, listen, target, valve, tt.extra)
		})
	}
	// Slow receivers' writers under the other rule, with connections
	// whose first write meets it before their server accepted.
	t.Run("pod to pod IPv4, the other slow-reader rule", func(t *testing.T) {
		other := "valve"
		switch {
		case valve:
			other = "tcp"
		case !valveKernel(t):
			t.Skip("this kernel cannot run the valve (TestSlowReaderValve checks its refusal): the rows above ran the backlog rule")
		}
		in := testutil.NewInstance(t)
		in.Settings = slices.Concat(in.Settings, flags, []string{"--slow-readers", other})
		b := testutil.Bed(t)
		srv, cli := testutil.Pod(t, b, "server"), testutil.Pod(t, b, "client")
		in.Attach(srv, cli)
		integrityRun(t, in, srv, cli, "0.0.0.0:9100", netip.AddrPortFrom(srv.IPv4, 9100).String(), other == "valve", nil)
	})
}

// integrityRun is one scenario of TestBypassIntegrity: the streams, then
// the counters they moved (through the valve, or the backlog rule).
func integrityRun(t *testing.T, in *testutil.Instance, srv, cli *testbed.Pod, listen, target string, valve bool, extra []string) {
	t.Helper()
	before := in.Counters()
	const slow = 4 << 20
	sum := integrity(t, in, srv, cli, listen, target, *integrityConns, append([]string{"--io", "epoll", "--slow-bytes", strconv.Itoa(slow)}, extra...)...)
	d := testutil.Delta(before, in.Counters())
	t.Logf("%d connections, %d bytes sent by the clients, %d redirected, %d through TCP (fallback_backlog=%d valve_opens=%d valve_closes=%d lingers=%d)",
		*integrityConns, sum.Sent, d["redirect_bytes"], d["pass_bytes"], d["fallback_backlog"], d["valve_opens"], d["valve_closes"], d["lingers"])
	n := uint64(*integrityConns)
	mustAtLeast(t, d, "established_active", n)
	mustAtLeast(t, d, "established_passive", n)
	// A client may send before its server is accepted; that
	// connection stays on TCP. Most must be bypassed.
	mustAtLeast(t, d, "conns_bypassed", n*3/4)
	// Everything but the slow receivers' floods (which move to
	// TCP past the limit) goes socket to socket, mostly.
	var slowStreams uint64
	for i := range *integrityConns {
		if peer.Mode(i%int(peer.NumModes)) == peer.ModeSlowReceiver {
			slowStreams++
		}
	}
	mustAtLeast(t, d, "redirect_bytes", (sum.Sent-slowStreams*slow)/2)
	if *integrityWindow > 0 {
		mustAtLeast(t, d, "redirect_windows", 1)
	}
	mustEqual(t, d, "err_sockhash", 0)
	mustEqual(t, d, "err_conn_table_full", 0)
	// Slow receivers' writers were pushed back through TCP by the
	// valve, which let them back once their readers caught up (each
	// flood pauses at three quarters), or went over the 1 MiB limit and
	// moved to TCP, and their bytes kept order across the switches (where the
	// kernel counts queued bytes; elsewhere the rule is off and they
	// all stay in the bypass).
	switch {
	case !readStatus(t, in).Kernel.PsockMsgTotLen:
		mustEqual(t, d, "fallback_backlog", 0)
	case valve:
		mustAtLeast(t, d, "valve_opens", 1)
		mustAtLeast(t, d, "valve_closes", 1)
		mustEqual(t, d, "fallback_backlog", 0)
	case *integrityBacklog == 1<<20:
		mustAtLeast(t, d, "fallback_backlog", 1)
		mustEqual(t, d, "valve_opens", 0)
	}
	mustEqual(t, d, "fallback_blocking", 0)
}

// TestBlockingIO: connections with an end reading in blocking mode stay on
// TCP (the kernel's sockmap receive path answers a blocking read interrupted
// by a signal with EAGAIN; Go's runtime signals its threads all the time, so
// this peer would see it). Every stream still verifies. A blocking client is
// known at the handshake and never enters the map; a blocking server before
// it is accepted, from its listener.
func TestBlockingIO(t *testing.T) {
	tests := []struct {
		name           string
		server, client string
		minBlocking    uint64 // connections kept on TCP for a blocking end
		minBypassed    uint64
	}{
		{"blocking both ends", "blocking", "blocking", 32, 0},
		{"blocking server, epoll client", "blocking", "epoll", 32, 0},
		{"epoll server, mixed clients", "epoll", "mixed", 16, 12},
	}
	// One test bed and datapath for every case, each on a port of its own.
	b := testutil.Bed(t)
	in := testutil.NewInstance(t)
	srv, cli := testutil.Pod(t, b, "server"), testutil.Pod(t, b, "client")
	in.Attach(srv, cli)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			port := uint16(9000 + i)
			before := in.Counters()
			integritySides(t, in, srv, cli, fmt.Sprintf("0.0.0.0:%d", port), netip.AddrPortFrom(srv.IPv4, port).String(), 32,
				[]string{"--io", tt.server}, []string{"--io", tt.client})
			d := testutil.Delta(before, in.Counters())
			// A client whose first send beats its server's accept is
			// kept on TCP before its ends' modes are looked at
			// (peer_not_ready): rare, more so than one in 16 only on a
			// slow (emulated) CPU.
			if nr := d["fallback_peer_not_ready"]; d["fallback_blocking"]+nr < tt.minBlocking || nr > tt.minBlocking/16 {
				t.Errorf("%d connections kept on TCP for a blocking end and %d before their server joined; want %d in all, at most %d of the second (%s)",
					d["fallback_blocking"], nr, tt.minBlocking, tt.minBlocking/16, nonzero(d))
			}
			mustAtLeast(t, d, "conns_bypassed", tt.minBypassed)
			if tt.minBypassed == 0 {
				mustEqual(t, d, "redirect_msgs", 0)
			}
			if tt.client == "blocking" {
				// A blocking client never enters the map: there its
				// reads would run in the sockmap's receive path (and
				// meet the interrupted-read bug) until it left.
				mustEqual(t, d, "evictions", 0)
			}
		})
	}
}

// TestLoopbackNamespaceIsolation runs, in two pods, a server and a client on
// 127.0.0.1 with the same port. Each client verifies every byte against the
// stream its own server sent: any cross-talk fails verification.
func TestLoopbackNamespaceIsolation(t *testing.T) {
	b := testutil.Bed(t)
	in := testutil.NewInstance(t)
	p1, p2 := testutil.Pod(t, b, "one"), testutil.Pod(t, b, "two")
	in.Attach(p1, p2)
	before := in.Counters()
	done := make(chan struct{}, 2)
	for _, p := range []*testbed.Pod{p1, p2} {
		go func(p *testbed.Pod) {
			defer func() { done <- struct{}{} }()
			integrity(t, in, p, p, "127.0.0.1:6379", "127.0.0.1:6379", 16, "--io", "epoll", "--slow-bytes", "1000000")
		}(p)
	}
	<-done
	<-done
	d := testutil.Delta(before, in.Counters())
	mustAtLeast(t, d, "conns_bypassed", 2*16*3/4)
	mustAtLeast(t, d, "redirect_msgs", 1)
}

// TestRemotePeerNotRedirected: only the client's pod is managed, as when
// the server is on another node. Nothing is redirected, every byte arrives,
// and a client leaves the map at its first send, or never joins it.
func TestRemotePeerNotRedirected(t *testing.T) {
	b := testutil.Bed(t)
	in := testutil.NewInstance(t)
	srv, cli := testutil.Pod(t, b, "remote"), testutil.Pod(t, b, "client")
	in.Attach(cli)
	before := in.Counters()
	// Full-duplex streams: the server writes as soon as it accepts, so a
	// client may hold the server's bytes before its own first send. With
	// the valve (sl_skb on the map) they wait in its psock queue, and the
	// client leaves at a later transmit that finds the queue read; without
	// it, at its first send.
	integrity(t, in, srv, cli, "0.0.0.0:9000", netip.AddrPortFrom(srv.IPv4, 9000).String(), 8, "--io", "epoll")
	d := testutil.Delta(before, in.Counters())
	t.Logf("full-duplex streams: %s", nonzero(d))
	mustEqual(t, d, "redirect_msgs", 0)
	mustEqual(t, d, "conns_bypassed", 0)
	mustAtLeast(t, d, "established_active", 8)
	mustEqual(t, d, "established_passive", 0)
	if d["pass_msgs"] > 8*4 {
		t.Errorf("remote connections kept paying sk_msg: %d messages passed for 8 connections", d["pass_msgs"])
	}
	// Request and response: each client sends first, so it has nothing
	// queued at its first transmit and leaves there, or never joined:
	// once enough connections to the destination found no managed server,
	// later ones stay on TCP from the start (learned destinations).
	start(t, srv, in.Bin, "peer", "echo", "0.0.0.0:9001")
	waitPort(t, srv, "0.0.0.0:9001")
	target := netip.AddrPortFrom(srv.IPv4, 9001).String()
	before = in.Counters()
	for i := 0; i < 8; i++ {
		run(t, cli, time.Minute, in.Bin, "peer", "pingpong", target, "--size", "100", "--count", "50", "--warmup", "0")
	}
	d = testutil.Delta(before, in.Counters())
	mustEqual(t, d, "redirect_msgs", 0)
	if n := d["evictions"] + d["fallback_no_peer"]; n < 8 {
		t.Errorf("%d of 8 remote request/response connections left the map at their first send or never joined it (%s)", n, nonzero(d))
	}
	// One pass through sk_msg each: a client that left at its first send.
	if d["pass_msgs"] > 8 {
		t.Errorf("remote request/response connections kept paying sk_msg: %d messages passed for 8 connections (%s)", d["pass_msgs"], nonzero(d))
	}
	var st struct {
		Sockets int `json:"bypassed_sockets"`
	}
	if err := json.Unmarshal([]byte(in.MustRun("status", "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	if st.Sockets != 0 {
		t.Errorf("%d sockets still in the map after remote connections closed", st.Sockets)
	}
}

// TestConnsTable checks `socklane conns` against live bypassed
// connections from two client pods: byte counts, filters by pod, port and
// address, and --watch.
func TestConnsTable(t *testing.T) {
	b := testutil.Bed(t)
	in := testutil.NewInstance(t)
	srv, cli, cli2 := testutil.Pod(t, b, "server"), testutil.Pod(t, b, "client"), testutil.Pod(t, b, "client2")
	in.Attach(srv, cli, cli2)
	start(t, srv, in.Bin, "peer", "echo", "0.0.0.0:7000")
	start(t, srv, in.Bin, "peer", "echo", "0.0.0.0:7001")
	waitPort(t, srv, "0.0.0.0:7000")
	waitPort(t, srv, "0.0.0.0:7001")
	// Hold connections open with ping-pong in the background.
	for _, c := range []struct {
		pod  *testbed.Pod
		port int
	}{{cli, 7000}, {cli2, 7001}} {
		pp := start(t, c.pod, in.Bin, "peer", "pingpong", fmt.Sprintf("%s:%d", srv.IPv4, c.port), "--size", "100", "--count", "2000000", "--warmup", "0")
		t.Cleanup(func() { _ = pp.cmd.Process.Kill() })
	}
	type row struct {
		State          string `json:"state"`
		Client, Server string
		ClientToServer struct{ Bytes uint64 } `json:"client_to_server"`
		ServerToClient struct{ Bytes uint64 } `json:"server_to_client"`
	}
	list := func(args ...string) []row {
		t.Helper()
		var rows []row
		if err := json.Unmarshal([]byte(in.MustRun(append([]string{"conns", "-o", "json"}, args...)...)), &rows); err != nil {
			t.Fatal(err)
		}
		return rows
	}
	var conns []row
	for i := 0; i < 50; i++ {
		conns = list()
		if len(conns) == 2 && conns[0].ClientToServer.Bytes > 0 && conns[1].ClientToServer.Bytes > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(conns) != 2 {
		t.Fatalf("conns shows %d connections, want 2: %+v", len(conns), conns)
	}
	for _, c := range conns {
		if c.State != "bypass" || c.ClientToServer.Bytes == 0 || c.ClientToServer.Bytes%100 != 0 {
			t.Errorf("unexpected row %+v", c)
		}
		// The echo trails its request by one message; and a direction's
		// bytes under an open verdict window are counted at its next
		// verdict, which the client's direction reaches first: up to one
		// window more.
		if d := int64(c.ClientToServer.Bytes) - int64(c.ServerToClient.Bytes); d < 0 || d > 100+int64(datapath.DefaultVerdictWindow) {
			t.Errorf("echo bytes differ: c->s %d, s->c %d", c.ClientToServer.Bytes, c.ServerToClient.Bytes)
		}
	}
	for _, tc := range []struct {
		name   string
		args   []string
		server []string // servers of the rows expected
	}{
		{"pod by cgroup", []string{"--cgroup", cli.Cgroup}, []string{srv.IPv4.String() + ":7000"}},
		{"server pod by cgroup", []string{"--cgroup", srv.Cgroup}, []string{srv.IPv4.String() + ":7000", srv.IPv4.String() + ":7001"}},
		{"port", []string{"--port", "7001"}, []string{srv.IPv4.String() + ":7001"}},
		{"address", []string{"--addr", cli2.IPv4.String()}, []string{srv.IPv4.String() + ":7001"}},
		{"no match", []string{"--port", "9"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, r := range list(append(tc.args, "--sort", "server")...) {
				got = append(got, r.Server)
			}
			if !slices.Equal(got, tc.server) {
				t.Errorf("conns %v: servers %v, want %v", tc.args, got, tc.server)
			}
		})
	}
	t.Run("watch", func(t *testing.T) {
		out := in.MustRun("conns", "-o", "json", "--watch", "--interval", "100ms", "--count", "3")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 3 {
			t.Fatalf("--watch --count 3 printed %d lines:\n%s", len(lines), out)
		}
		var first, last []row
		if json.Unmarshal([]byte(lines[0]), &first) != nil || json.Unmarshal([]byte(lines[2]), &last) != nil || len(first) != 2 || len(last) != 2 {
			t.Fatalf("--watch lines do not each hold both connections:\n%s", out)
		}
		if last[0].ClientToServer.Bytes+last[1].ClientToServer.Bytes <= first[0].ClientToServer.Bytes+first[1].ClientToServer.Bytes {
			t.Errorf("bytes did not grow between watch listings")
		}
	})
	if out, err := in.Run("conns", "--sort", "speed"); err == nil || !strings.Contains(out, "--sort") {
		t.Errorf("conns --sort speed: %v %s", err, out)
	}
}
