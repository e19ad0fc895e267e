package e2e

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/testutil"
)

// TestMessageBudget is the attack on the kernel memory a redirect pins: each
// redirected send is a struct sk_msg in its receiver's queue until read (a
// KiB from kmalloc, charged to no cgroup), whatever its size, and the
// backlog rule and the valve count bytes. A client streams 1-byte writes
// with TCP_NODELAY (which keeps a small stream in the bypass) to a sink that
// reads nothing for seconds; before the budget each write pinned a KiB, up
// to the byte limit's worth of writes (a GiB and more on one connection).
// Now the receiver's queue takes at most the backlog limit's worth of
// messages at a KiB each (4,096 at the 4 MiB set here), twice it through
// the backlog rule's grace: the valve then passes the
// writes to TCP (which merges them), or the direction moves to TCP. The
// node's unreclaimable slab (SUnreclaim) may grow by the budget and TCP's
// own, not by the writes. The valve's own writes are TCP segments, each a
// message in the sink's queue (TCP's coalescing of a receive queue never
// runs there), so the open valve holds the writer to a congestion window
// of two segments (valve_cwnd_clamps): TCP merges the writes it holds
// back. Without it the slab grew by 27-57 MB in half the runs on 6.18 (up
// to 64 Ki 1-byte segments in the 64 KiB window the sink offers), with it
// by about 4 MB. The same with a 64 KiB write after the first,
// whose verdict window would otherwise cover the next 192 Ki 1-byte writes
// unseen. Once
// the sink reads, every byte arrives.
func TestMessageBudget(t *testing.T) {
	const (
		limit  = 4 << 20  // --backlog-limit
		budget = 4096     // limit / SL_MSG_COST
		slack  = 24 << 20 // the budget's 4 MiB (8 through the grace), TCP's, the machine's
	)
	// 1-byte writes: 200 MB of slab at a KiB each. The kernel matrix's
	// emulated guests write 50,000, still twice the slack were they all
	// redirected (at 200,000 the row took two minutes on 6.12).
	writes := 200000
	if testing.Short() {
		writes = 50000
	}
	for i, tc := range []struct {
		name, mode string
		large      int  // a write of this size after the first
		late       bool // --reader-verdict late: asked for at half the budget
	}{
		{"valve", "valve", 0, false},
		{"valve, after a 64 KiB write", "valve", 64 << 10, false},
		{"valve, late verdict", "valve", 0, true},
		{"valve, late verdict, after a 64 KiB write", "valve", 64 << 10, true},
		{"tcp", "tcp", 0, false},
		{"tcp, after a 64 KiB write", "tcp", 64 << 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The kernel matrix runs -test.short: the rows after a large
			// write take every rule the others do (emulated, a row is a
			// minute and more).
			if testing.Short() && tc.late {
				t.Skip("-test.short (the kernel matrix): --reader-verdict late is opt-in; kerneltest's TestReaderVerdictLate proves its join on each kernel")
			}
			if testing.Short() && tc.large == 0 {
				t.Skip("-test.short: the row after a 64 KiB write covers the budget and the window")
			}
			if tc.mode == "valve" && !valveKernel(t) {
				t.Skip("this kernel cannot run the valve (TestSlowReaderValve checks it is refused)")
			}
			_, in, srv, cli := serverClient(t, "--slow-readers", tc.mode, "--backlog-limit", fmt.Sprint(limit), "--reader-verdict", lateWord(tc.late))
			if !readStatus(t, in).Kernel.PsockMsgTotLen {
				t.Skip("this kernel's sk_psock does not count queued bytes: the bypass is off by default, and no rule sees a reader's queue")
			}
			port := uint16(7470 + i)
			listen := fmt.Sprintf("0.0.0.0:%d", port)
			start(t, srv, in.Bin, "peer", "sink", listen, "--delay", "8s")
			waitPort(t, srv, listen)
			slab := unreclaimableSlab(t)
			counters := pinnedCounters(t, in)
			before := counters()
			st := start(t, cli, in.Bin, "peer", "stream", netip.AddrPortFrom(srv.IPv4, port).String(),
				"--size", "1", "--count", fmt.Sprint(writes), "--nodelay", "1", "--large", fmt.Sprint(tc.large))
			// The writer stops once held back (the sink reads only
			// after 8 s).
			d := heldBack(counters, before, 5)
			grew := int64(unreclaimableSlab(t)) - int64(slab)
			t.Logf("held back: unreclaimable slab %+d KiB; %v", grew>>10, nonzero(d))
			if grew > slack {
				t.Errorf("the node's unreclaimable slab grew by %d KiB while the writer was held back, want at most %d", grew>>10, slack>>10)
			}
			// Bytes redirected as 1-byte writes: at most the budget's
			// (or twice it, through the grace).
			most := uint64(tc.large + budget)
			if tc.mode == "tcp" {
				most = uint64(tc.large + 2*budget)
			}
			if d["redirect_bytes"] > most {
				t.Errorf("%d bytes redirected to a reader that read nothing, want at most %d", d["redirect_bytes"], most)
			}
			mustEqual(t, d, "msg_budget", 1)
			if tc.mode == "tcp" {
				mustEqual(t, d, "fallback_backlog", 1)
			} else {
				mustEqual(t, d, "valve_opens", 1)
				mustAtLeast(t, d, "valve_bytes", 1)
				mustEqual(t, d, "valve_cwnd_clamps", 1)
				mustEqual(t, d, "fallback_backlog", 0)
			}
			if tc.late {
				mustEqual(t, d, "late_verdicts", 1)
			}
			// stream fails unless the sink counted every byte sent.
			if err := st.wait(t, time.Minute); err != nil {
				t.Fatalf("stream: %v: %s", err, st.err.String())
			}
		})
	}
}

// heldBack waits until writers held back have moved the counters (bytes
// redirected and passed) and stopped, for at least settle tenths of a
// second and at most five seconds more, and returns the counters' deltas
// since before.
// The counters are read in the test's process (pinnedCounters): a
// `socklane status` process, seconds under emulation, would let the
// wait outlast the sink's pause.
func heldBack(counters func() map[string]uint64, before map[string]uint64, settle int) map[string]uint64 {
	var d map[string]uint64
	var sent uint64
	for i := 0; i < settle+50; i++ {
		time.Sleep(100 * time.Millisecond)
		d = testutil.Delta(before, counters())
		// Settled once the writers moved bytes and then stopped (a
		// writer just started, slow under emulation, has moved none).
		n := d["redirect_bytes"] + d["pass_bytes"]
		if i >= settle && n == sent && n > 0 {
			break
		}
		sent = n
	}
	return d
}

// unreclaimableSlab is the node's SUnreclaim (/proc/meminfo) in bytes.
func unreclaimableSlab(t *testing.T) uint64 {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "SUnreclaim:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(v, "kB")), 10, 64)
			if err != nil {
				t.Fatalf("parsing %q: %v", s.Text(), err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no SUnreclaim in /proc/meminfo (%v)", s.Err())
	return 0
}

// TestMessageQuota is the attack on the budget of messages with many
// connections: the budget bounds what one connection's reader holds (6,144
// messages, 6 MiB of slab charged to no cgroup, at the default backlog
// limit), and a pod opens thousands. Twelve connections from one client pod
// stream 1-byte TCP_NODELAY writes to a sink that reads nothing for
// seconds: before the quota they pinned twelve budgets (72 MiB, twice it
// through the backlog rule's grace). Now the client's owner (its cgroup, as
// its connection slots) may hold --owner-messages (8,192 here) over all its
// connections, and a connection past it holding SL_MSG_LIGHT messages or
// more opens the valve or moves to TCP: the node's unreclaimable slab grows
// by the quota and TCP's own, the redirected 1-byte writes are at most the
// quota and each connection's light allowance, status names the owner.
// Meanwhile another pod's stream keeps the bypass and is refused nothing,
// and so is request and response from the attacker's own pod; once the
// sink reads, every byte arrives and the owner's charge goes back
// to zero as the connections close.
func TestMessageQuota(t *testing.T) {
	const (
		quota  = 8192
		conns  = 12
		writes = 50000 // per connection: far over its share of the quota
		light  = 16    // SL_MSG_LIGHT
		// The quota's 8 MiB (8,192 messages from kmalloc-1k) and the
		// machine's own: twelve new processes, their threads, sockets
		// and TCP's 1-byte segments past what TCP's memory counts
		// (6.5-9 MiB over the quota in the tcp row on 6.18). Without
		// the quota the writers pin 72 MiB.
		slack = 24 << 20
	)
	for i, tc := range []struct {
		name, mode string
		late       bool // --reader-verdict late: asked for at the quota
	}{
		{"valve", "valve", false},
		{"valve, late verdict", "valve", true},
		{"tcp", "tcp", false},
	} {
		mode := tc.mode
		t.Run(tc.name, func(t *testing.T) {
			if mode == "valve" && !valveKernel(t) {
				t.Skip("this kernel cannot run the valve (TestSlowReaderValve checks it is refused)")
			}
			b, in, srv, cli := serverClient(t, "--slow-readers", mode, "--owner-messages", fmt.Sprint(quota), "--reader-verdict", lateWord(tc.late))
			if !readStatus(t, in).Kernel.PsockMsgTotLen {
				t.Skip("this kernel's sk_psock does not count queued bytes: the bypass is off by default, and no rule sees a reader's queue")
			}
			vic := testutil.Pod(t, b, "victim")
			in.Attach(vic)
			port := 7480 + 2*i
			sinkAt := fmt.Sprintf("0.0.0.0:%d", port)
			start(t, srv, in.Bin, "peer", "sink", sinkAt, "--delay", "15s")
			waitPort(t, srv, sinkAt)
			slab, tcpMem := unreclaimableSlab(t), tcpMemory(t)
			counters := pinnedCounters(t, in)
			before := counters()
			var streams []*proc
			for range conns {
				streams = append(streams, start(t, cli, in.Bin, "peer", "stream", fmt.Sprintf("%s:%d", srv.IPv4, port),
					"--size", "1", "--count", fmt.Sprint(writes), "--nodelay", "1"))
			}
			d := heldBack(counters, before, 10)
			grew, tcpGrew := int64(unreclaimableSlab(t))-int64(slab), int64(tcpMemory(t))-int64(tcpMem)
			t.Logf("held back: unreclaimable slab %+d KiB, TCP's memory %+d KiB; %v", grew>>10, tcpGrew>>10, nonzero(d))
			// What the valve passes reaches the reader through its
			// psock's queue too (in order with the redirected bytes):
			// each TCP segment there is a message as well, as many as
			// the reader's receive buffer holds segments, at most about
			// twice what TCP charges for them (a 1-byte segment's true
			// size is over half a KiB). The budget bounds that per
			// connection; the quota bounds what is redirected.
			most := int64(slack)
			if mode == "valve" {
				most += 2 * max(tcpGrew, 0)
			}
			if grew-tcpGrew > most {
				t.Errorf("the node's unreclaimable slab grew by %d KiB beyond TCP's memory (%+d KiB) while twelve writers were held back, want at most %d", (grew-tcpGrew)>>10, tcpGrew>>10, most>>10)
			}
			if most := uint64(quota + conns*light); d["redirect_bytes"] > most {
				t.Errorf("%d 1-byte writes redirected to a reader that read nothing, want at most %d (the quota and each connection's light allowance)", d["redirect_bytes"], most)
			}
			mustAtLeast(t, d, "msg_quota", 1)
			if mode == "tcp" {
				// Each connection needs more than its share: each moves.
				mustEqual(t, d, "fallback_backlog", conns)
			} else {
				mustAtLeast(t, d, "valve_opens", 1)
				mustEqual(t, d, "fallback_backlog", 0)
			}
			if tc.late {
				mustAtLeast(t, d, "late_verdicts", 1)
				mustEqual(t, d, "err_late_verdict", 0)
			}
			o := ownerOf(t, in, cli)
			if o == nil || o.RefusedMsgs == 0 || o.Msgs > quota {
				t.Fatalf("the client pod's owner: %+v, want refused messages and at most %d held", o, quota)
			}
			t.Logf("the client pod's owner holds %d messages, refused %d sends", o.Msgs, o.RefusedMsgs)

			// The victim: another pod's stream to a reader that reads.
			vat := fmt.Sprintf("0.0.0.0:%d", port+1)
			start(t, srv, in.Bin, "peer", "sink", vat)
			waitPort(t, srv, vat)
			vb := in.Counters()
			vs := start(t, vic, in.Bin, "peer", "stream", fmt.Sprintf("%s:%d", srv.IPv4, port+1), "--size", "65536", "--count", "32")
			if err := vs.wait(t, time.Minute); err != nil {
				t.Fatalf("the victim's stream: %v: %s", err, vs.err.String())
			}
			vd := testutil.Delta(vb, in.Counters())
			t.Logf("the victim's stream: %v", nonzero(vd))
			mustAtLeast(t, vd, "redirect_bytes", 65536)
			mustEqual(t, vd, "msg_quota", 0)
			mustEqual(t, vd, "fallback_backlog", 0)
			if o := ownerOf(t, in, vic); o != nil {
				t.Errorf("the victim pod was refused: %+v", *o)
			}

			// Request and response from the attacker's own pod, its
			// quota held: each request finds its reader's queue empty,
			// so it is redirected (without a window) and refused
			// nothing.
			eat := fmt.Sprintf("0.0.0.0:%d", port+100)
			start(t, srv, in.Bin, "peer", "echo", eat)
			waitPort(t, srv, eat)
			pb := in.Counters()
			pp := start(t, cli, in.Bin, "peer", "pingpong", fmt.Sprintf("%s:%d", srv.IPv4, port+100), "--size", "64", "--count", "2000")
			if err := pp.wait(t, time.Minute); err != nil {
				t.Fatalf("pingpong from the attacker's pod: %v: %s", err, pp.err.String())
			}
			pd := testutil.Delta(pb, in.Counters())
			t.Logf("request and response from the attacker's pod: %v", nonzero(pd))
			mustAtLeast(t, pd, "redirect_msgs", 2*2000)
			mustEqual(t, pd, "msg_quota", 0)
			mustEqual(t, pd, "fallback_backlog", 0)

			// stream fails unless the sink counted every byte sent.
			for i, st := range streams {
				if err := st.wait(t, 2*time.Minute); err != nil {
					t.Fatalf("attacker stream %d: %v: %s", i, err, st.err.String())
				}
			}
			waitFor(t, func() bool { o := ownerOf(t, in, cli); return o != nil && o.Msgs == 0 })
		})
	}
}

// tcpMemory is the memory TCP's sockets are charged for on the node
// (/proc/net/sockstat's TCP mem, in pages), in bytes.
func tcpMemory(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/net/sockstat")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "TCP:" {
			continue
		}
		for i := 1; i+1 < len(f); i++ {
			if f[i] == "mem" {
				pages, err := strconv.ParseUint(f[i+1], 10, 64)
				if err != nil {
					t.Fatalf("parsing %q: %v", line, err)
				}
				return pages * uint64(os.Getpagesize())
			}
		}
	}
	t.Fatalf("no TCP mem in /proc/net/sockstat: %s", b)
	return 0
}
