package e2e

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/testutil"
)

// TestSynRingFlood: where the valve runs, listeners of attached cgroups
// record each SYN they answer in their CPU's ring (sl_syn_rings), for a
// client of this node to find at its handshake's end (both ends of a
// bypassed connection then give BBR up before it starts). Any pod can
// overwrite the rings by answering SYNs of its own: here a pod answers
// 40,000 at its own listener from sockets that never complete (it drops
// the SYN-ACKs in its own network namespace and raised its listen backlog
// there) while connections between two other pods are made. They join the
// bypass and carry every byte (integrity streams, MSG_PEEK readers and slow
// receivers among them): the most the flood can do is push a victim's SYN
// out of its ring between its SYN-ACK and its client's handshake, a few
// microseconds, which leaves that client on BBR. Nothing the flood does
// takes memory others need: the rings are fixed, and hold its SYNs after.
func TestSynRingFlood(t *testing.T) {
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
	before := in.Counters()
	flood := start(t, att, in.Bin, "peer", "synflood", "--ports", "7700", "--count", strconv.Itoa(syns), att.IPv4.String())
	// The flood reached the rings before the victims connect: one CPU's
	// ring is full of its SYNs, none taken (its handshakes never end).
	fullRing(t, dp)
	integrity(t, in, srv, cli, "0.0.0.0:9000", netip.AddrPortFrom(srv.IPv4, 9000).String(), 16, "--io", "epoll")
	d := testutil.Delta(before, in.Counters())
	running := flood.cmd.ProcessState == nil
	if err := flood.wait(t, 2*time.Minute); err != nil {
		t.Fatalf("synflood: %v\n%s", err, flood.err.String())
	}
	if n, err := strconv.Atoi(strings.TrimSpace(flood.out.String())); err != nil || n != syns {
		t.Fatalf("synflood sent %q SYNs, want %d: %v", flood.out.String(), syns, err)
	}
	t.Logf("victims: %v", nonzero(d))
	mustAtLeast(t, d, "conns_bypassed", 16)
	mustEqual(t, d, "fallback_backlog", 0)
	// Each end may give BBR up (up to 32); not asserted, as the flood may
	// push a victim's SYN out of its ring (TestValveUnpaced asserts it
	// without a flood).
	t.Logf("%d of the victims' 32 sockets gave BBR up", d["cc_unpaced"])

	t.Logf("the flood was still running when the victims were done: %v", running)
}

// fullRing waits until some CPU's SYN ring is full of SYNs no client took.
func fullRing(t *testing.T, dp *datapath.Datapath) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		rings, size, err := dp.SynRings()
		if err != nil {
			t.Fatal(err)
		}
		for _, ports := range rings {
			if len(ports) == size {
				t.Logf("SYN rings: %v (size %d)", rings, size)
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no CPU's SYN ring filled with the flood's SYNs within a minute (%v): the flood did not reach them, so this test proves nothing", rings)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
