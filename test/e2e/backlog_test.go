package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/testutil"
)

// TestBacklogGrace: a receiver's queue may go over the backlog limit for a
// moment (a writer on its reader's CPU queues a scheduler slice ahead)
// without the connection leaving the bypass; over it for longer than the
// grace, or over twice the limit, it moves to TCP, and every byte still
// arrives. Limit 1 MiB; the sink starts reading only after --delay. On a
// kernel whose sk_psock does not count queued bytes (6.1) the rule is off,
// as status says: everything stays in the bypass and still arrives. The
// rule is --slow-readers tcp's, asked for by name (the valve pushes the
// writer back instead: TestSlowReaderValve).
func TestBacklogGrace(t *testing.T) {
	_, in, srv, cli := serverClient(t, "--slow-readers", "tcp", "--backlog-limit", "1048576")
	ks := readStatus(t, in)
	if !ks.Kernel.PsockMsgTotLen {
		t.Logf("this kernel's sk_psock does not count queued bytes: the rule is off (%q)", ks.Adapted)
		if !slices.ContainsFunc(ks.Adapted, func(a string) bool { return strings.Contains(a, "receiver backlog rule off") }) {
			t.Errorf("status does not say the backlog rule is off: %q", ks.Adapted)
		}
	}
	const msg = 64 << 10
	for i, tc := range []struct {
		name     string
		delay    string // before the sink reads
		count    int    // 64 KiB messages
		interval string // between them
		fallback uint64
		// Bounds on the bytes redirected before the fallback, if any.
		minRedirected, maxRedirected uint64
	}{
		// 1.5 MiB in a burst: over the limit for well under the grace.
		{"burst under twice the limit", "30ms", 24, "0s", 0, 24 * msg, 24*msg + 64},
		// 1.9 MiB, a message every 5 ms: over the limit from the 17th
		// message, for longer than the grace before reaching twice it.
		{"over the limit past the grace", "2s", 30, "5ms", 1, 17 * msg, 30*msg - 1},
		// 2.5 MiB in a burst: over twice the limit at once.
		{"over twice the limit", "300ms", 40, "0s", 1, 32 * msg, 34 * msg},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d map[string]uint64
			// A client that sends before its server joined stays on
			// TCP (fallback_peer_not_ready), which an emulated CPU
			// (the kernel matrix) sometimes makes happen: such a run
			// says nothing of the backlog, so it is run again.
			for attempt := 0; attempt < 3; attempt++ {
				port := 7400 + i + 10*attempt
				listen := fmt.Sprintf("0.0.0.0:%d", port)
				start(t, srv, in.Bin, "peer", "sink", listen, "--delay", tc.delay)
				waitPort(t, srv, listen)
				before := in.Counters()
				st := start(t, cli, in.Bin, "peer", "stream", fmt.Sprintf("%s:%d", srv.IPv4, port),
					"--size", fmt.Sprint(msg), "--count", fmt.Sprint(tc.count), "--interval", tc.interval)
				// stream fails unless the sink counted every byte sent.
				if err := st.wait(t, time.Minute); err != nil {
					t.Fatalf("stream: %v: %s", err, st.err.String())
				}
				if d = testutil.Delta(before, in.Counters()); d["fallback_peer_not_ready"] == 0 {
					break
				}
				t.Logf("the client sent before its server joined: run again (deltas: %v)", nonzero(d))
			}
			if !ks.Kernel.PsockMsgTotLen {
				tc.fallback, tc.minRedirected, tc.maxRedirected = 0, uint64(tc.count)*msg, uint64(tc.count)*msg+64
			}
			if testing.Short() && tc.fallback == 1 {
				// Under emulation (the kernel matrix) a burst past the
				// limit can outlast the 50 ms grace before it reaches
				// twice the limit: either rule may move it, once over the
				// limit, and neither lets more than twice it through.
				tc.minRedirected = 17 * msg
			}
			mustEqual(t, d, "fallback_backlog", tc.fallback)
			// The sink's 8-byte count comes back through the bypass too.
			if r := d["redirect_bytes"] - 8; r < tc.minRedirected || r > tc.maxRedirected {
				t.Errorf("%d bytes redirected, want %d to %d (deltas: %v)", r, tc.minRedirected, tc.maxRedirected, nonzero(d))
			}
		})
	}
}

// TestBacklogReceiverLeaves: a socket whose incoming direction moved to
// TCP leaves the map once it has read what was redirected to it, without
// a transmit of its own: a timer checks it. Until it leaves, FIONREAD
// counts only redirected bytes (the kernel's tcp_bpf_ioctl), so a reader
// that sizes its reads by FIONREAD (nginx, Java's available()) sees 0 for
// what TCP queued, and sends nothing while it waits for more. The sink is
// such a reader: it starts 300 ms after accepting (131 sends of 16 KiB at
// once: over twice the limit at the 129th, the rest through TCP, within
// the receive window and acknowledged long before, then the FIN), and
// fails if FIONREAD says 0 for 2 s with bytes queued. Without the timer
// it failed so: the socket stayed in the map, as nothing made it transmit.
func TestBacklogReceiverLeaves(t *testing.T) {
	_, in, srv, cli := serverClient(t, "--slow-readers", "tcp", "--backlog-limit", "1048576")
	if !readStatus(t, in).Kernel.PsockMsgTotLen || fionreadBypassed(t, in) {
		// 6.1: no backlog rule (nothing moves to TCP, no socket waits to
		// leave), and FIONREAD answers 0 for redirected bytes anyway.
		t.Log("this kernel neither counts queued bytes nor answers FIONREAD for redirected ones: no move to TCP to leave after")
		return
	}
	const msg = 16 << 10
	listen := "0.0.0.0:7410"
	// Under emulation (the kernel matrix) the burst itself takes a while:
	// the sink starts later.
	delay := "300ms"
	if testing.Short() {
		delay = "3s"
	}
	sink := start(t, srv, in.Bin, "peer", "sink", listen, "--delay", delay, "--fionread")
	waitPort(t, srv, listen)
	before := in.Counters()
	// stream fails unless the sink answered with every byte counted.
	st := start(t, cli, in.Bin, "peer", "stream", fmt.Sprintf("%s:7410", srv.IPv4), "--size", fmt.Sprint(msg), "--count", "131")
	if err := st.wait(t, time.Minute); err != nil {
		t.Fatalf("stream: %v: %s; sink: %s", err, st.err.String(), sink.err.String())
	}
	d := testutil.Delta(before, in.Counters())
	mustEqual(t, d, "fallback_backlog", 1)
	mustAtLeast(t, d, "pass_bytes", 1)
	mustEqual(t, d, "evictions", 2)
}

// TestEvictTimerQuota is the attack on the timers of sockets waiting to
// leave the map: each checks up to 1,000 times a second in the kernel,
// charged to no process, so a pod must not have the node run thousands of
// them for it. A client pod streams over the backlog limit to a sink that
// reads only seconds later, on twelve connections: every receiving socket
// moves to TCP holding unread redirected bytes and waits to leave. Its
// owner (the client's cgroup, as its connection slots) gets four timers
// (--owner-evict-timers 4); the rest are refused, counted and named by
// status, and wait for their own transmits. Meanwhile another pod's
// FIONREAD reader after a backlog move (TestBacklogReceiverLeaves) still
// gets its timer and every byte; once the sink has read, the attacker's
// streams complete and its timers are back.
func TestEvictTimerQuota(t *testing.T) {
	const quota, conns = 4, 12
	b, in, srv, cli := serverClient(t, "--slow-readers", "tcp", "--backlog-limit", "1048576", "--owner-evict-timers", fmt.Sprint(quota))
	if !readStatus(t, in).Kernel.PsockMsgTotLen || fionreadBypassed(t, in) {
		t.Log("this kernel neither counts queued bytes nor answers FIONREAD for redirected ones: no move to TCP to leave after")
		return
	}
	vic := testutil.Pod(t, b, "victim")
	in.Attach(vic)
	if o := ownerOf(t, in, cli); o != nil {
		t.Fatalf("the client pod is over a quota before the attack: %+v", o)
	}
	before := in.Counters()
	const msg = 16 << 10
	// The attacker's sink reads only after the victim's stream is done
	// (under emulation it takes tens of seconds).
	delay := "10s"
	if testing.Short() {
		delay = "60s"
	}
	start(t, srv, in.Bin, "peer", "sink", "0.0.0.0:7420", "--delay", delay)
	waitPort(t, srv, "0.0.0.0:7420")
	var streams []*proc
	for i := 0; i < conns; i++ {
		// 131 sends of 16 KiB: over twice the limit at the 129th, the
		// rest through TCP, acknowledged by a receiver that then waits.
		streams = append(streams, start(t, cli, in.Bin, "peer", "stream", fmt.Sprintf("%s:7420", srv.IPv4),
			"--size", fmt.Sprint(msg), "--count", "131"))
	}
	waitFor(t, func() bool {
		o := ownerOf(t, in, cli)
		return o != nil && o.RefusedEvictTimers >= conns-quota && testutil.Delta(before, in.Counters())["fallback_backlog"] == conns
	})
	if o := ownerOf(t, in, cli); o.EvictTimers != quota {
		t.Errorf("the client pod holds %d timers, want its quota %d: %+v", o.EvictTimers, quota, *o)
	}
	mustAtLeast(t, testutil.Delta(before, in.Counters()), "evict_timer_quota", conns-quota)

	// The victim: a FIONREAD reader that needs its timer to leave.
	sink := start(t, srv, in.Bin, "peer", "sink", "0.0.0.0:7421", "--delay", "300ms", "--fionread")
	waitPort(t, srv, "0.0.0.0:7421")
	vs := start(t, vic, in.Bin, "peer", "stream", fmt.Sprintf("%s:7421", srv.IPv4), "--size", fmt.Sprint(msg), "--count", "131")
	if err := vs.wait(t, time.Minute); err != nil {
		t.Fatalf("the victim's stream: %v: %s; sink: %s", err, vs.err.String(), sink.err.String())
	}
	if o := ownerOf(t, in, vic); o != nil {
		t.Errorf("the victim pod was refused: %+v", *o)
	}
	if o := ownerOf(t, in, cli); o.EvictTimers != quota {
		t.Errorf("the client pod holds %d timers during the victim's stream, want %d", o.EvictTimers, quota)
	}

	for i, st := range streams {
		if err := st.wait(t, 2*time.Minute); err != nil {
			t.Fatalf("attacker stream %d: %v: %s", i, err, st.err.String())
		}
	}
	waitFor(t, func() bool { o := ownerOf(t, in, cli); return o != nil && o.EvictTimers == 0 })
	d := testutil.Delta(before, in.Counters())
	mustEqual(t, d, "fallback_backlog", conns+1)
	mustEqual(t, d, "evictions", 2*(conns+1))
}
