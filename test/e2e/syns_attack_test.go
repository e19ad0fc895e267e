package e2e

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/testutil"
)

// TestLocalSynsFlood: where the valve runs, listeners of attached cgroups
// record each SYN they answer in sl_local_syns, for a client of this node
// to find at its handshake's end (both ends of a bypassed connection then
// give BBR up before it starts). Any pod can fill that table by answering
// SYNs of its own: here a pod answers 40,000 at its own listener from
// sockets that never complete (it drops the SYN-ACKs in its own network
// namespace and raised its listen backlog there). The table is an LRU:
// the flood fills it, and connections between two other
// pods made while it is full still join the bypass and carry every byte
// (integrity streams, MSG_PEEK readers and slow receivers among them): the
// most the flood can do is age a victim's entry out between its SYN-ACK
// and its client's handshake, a few microseconds, which leaves that
// client on BBR.
func TestLocalSynsFlood(t *testing.T) {
	if !valveKernel(t) {
		t.Skip("this kernel cannot run the valve (TestSlowReaderValve checks it is refused): no SYN is recorded without it")
	}
	testutil.RequireCommand(t, "iptables")
	b := testutil.Bed(t)
	in := testutil.NewInstance(t)
	srv, cli, att := testutil.Pod(t, b, "server"), testutil.Pod(t, b, "client"), testutil.Pod(t, b, "attacker")
	in.Attach(srv, cli, att)
	dp, err := node.OpenRunning("/sys/fs/bpf", in.Name)
	if err != nil {
		t.Fatalf("opening the running datapath: %v", err)
	}
	t.Cleanup(func() { _ = dp.Close() })

	run(t, att, time.Minute, "sysctl", "-w", "net.core.somaxconn=65535")
	run(t, att, time.Minute, "iptables", "-w", "-A", "INPUT", "-p", "tcp", "--tcp-flags", "SYN,ACK", "SYN,ACK", "-j", "DROP")
	start(t, att, in.Bin, "peer", "listen", "--ports", "7700", att.IPv4.String())
	waitPort(t, att, "0.0.0.0:7700")
	const syns = 40000
	out := run(t, att, 2*time.Minute, in.Bin, "peer", "synflood", "--ports", "7700", "--count", strconv.Itoa(syns), att.IPv4.String())
	if n, err := strconv.Atoi(strings.TrimSpace(out)); err != nil || n != syns {
		t.Fatalf("synflood sent %q SYNs, want %d: %v", out, syns, err)
	}
	held, capacity, err := dp.LocalSyns()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sl_local_syns holds %d of %d after %d SYNs answered", held, capacity, syns)
	// The LRU bounds the table by construction; what is checked is that
	// the flood reached it: ports cycle, so at most the ephemeral
	// range's worth of distinct tuples, past the capacity (an LRU evicts
	// in batches, so it holds less than its capacity once full: 13,500
	// of 16,384 here).
	if held < capacity/2 {
		t.Fatalf("sl_local_syns holds %d of %d after the flood: it did not fill the table, so this test proves nothing", held, capacity)
	}

	before := in.Counters()
	integrity(t, in, srv, cli, "0.0.0.0:9000", netip.AddrPortFrom(srv.IPv4, 9000).String(), 16, "--io", "epoll")
	d := testutil.Delta(before, in.Counters())
	t.Logf("victims: %v", nonzero(d))
	mustAtLeast(t, d, "conns_bypassed", 16)
	// Their clients found their SYNs, answered microseconds before, in
	// the full table (each end gives BBR up: up to 32); not asserted, as
	// the flood may age one out.
	t.Logf("%d of the victims' 32 sockets gave BBR up", d["cc_unpaced"])
	mustEqual(t, d, "fallback_backlog", 0)
}
