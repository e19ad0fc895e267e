package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/testutil"
)

// TestSmallStreams: with --small-streams tcp (the default), a fast one-way
// stream of small sends whose writer leaves Nagle on moves to TCP, which
// coalesces the writes, once SL_STREAM_WINDOWS (4) units of a small send's
// verdict window (64 sends, at most 4 KiB: small_window) went with nothing
// sent back and the sends close together, for 1-byte sends as for 16;
// both sockets then leave the map and every byte arrives. So does a
// stream of 64-byte sends to a reader that starts reading late: past half
// the reader's budget of messages (msgs_held) its sends get a verdict
// each, without windows, and those verdicts make up the units. The same stream from a
// writer that set TCP_NODELAY (Go's default), which TCP would send a
// segment per write, stays and is counted (small_stream_nodelay). Ping-pong
// of the same messages (the other direction sends between windows), a
// one-way stream slower than the rule (a pause of 200 us after each send)
// and sends of SL_STREAM_SMALL (128) bytes stay in the bypass.
// With --small-streams bypass the fast streams stay too.
func TestSmallStreams(t *testing.T) {
	const port = 7450
	for _, setting := range []string{"tcp", "bypass"} {
		t.Run(setting, func(t *testing.T) {
			// A backlog limit of 8 MiB: a budget of 8,192 messages, half of
			// which lets every window be whole (msgs_held).
			_, in, srv, cli := serverClient(t, "--small-streams", setting, "--backlog-limit", "8388608")
			sink, echo, late := fmt.Sprintf("0.0.0.0:%d", port), fmt.Sprintf("0.0.0.0:%d", port+1), fmt.Sprintf("0.0.0.0:%d", port+2)
			start(t, srv, in.Bin, "peer", "sink", sink)
			start(t, srv, in.Bin, "peer", "echo", echo)
			start(t, srv, in.Bin, "peer", "sink", late, "--delay", "300ms")
			waitPort(t, srv, sink)
			waitPort(t, srv, echo)
			waitPort(t, srv, late)
			to := func(p int) string { return fmt.Sprintf("%s:%d", srv.IPv4, p) }
			nagle := []string{"--nodelay", "-1"}
			for _, tc := range []struct {
				name    string
				args    []string
				size    uint32 // of each send
				sent    uint64 // bytes the client sends
				moves   bool   // with --small-streams tcp
				nodelay bool   // kept for TCP_NODELAY, with --small-streams tcp
				windows uint64 // at most this many verdict windows before the move (0: any)
			}{
				{"fast stream", append([]string{"stream", to(port), "--size", "16", "--count", "40000"}, nagle...), 16, 16 * 40000, true, false, 0},
				{"fast stream, 1-byte sends", append([]string{"stream", to(port), "--size", "1", "--count", "200000"}, nagle...), 1, 200000, true, false, 0},
				// One window of 64-byte sends (4,033 messages at the
				// worst) takes the budget's first half: every later send
				// gets a verdict.
				{"fast stream, late reader", append([]string{"stream", to(port + 2), "--size", "64", "--count", "10000"}, nagle...), 64, 64 * 10000, true, false, 2},
				{"fast stream, TCP_NODELAY", []string{"stream", to(port), "--size", "16", "--count", "40000", "--nodelay", "1"}, 16, 16 * 40000, false, true, 0},
				{"ping-pong", []string{"pingpong", to(port + 1), "--size", "16", "--count", "4000", "--warmup", "0"}, 16, 16 * 4000, false, false, 0},
				{"slow stream", append([]string{"stream", to(port), "--size", "16", "--count", "2000", "--interval", "200us"}, nagle...), 16, 16 * 2000, false, false, 0},
				{"128-byte sends", append([]string{"stream", to(port), "--size", "128", "--count", "20000"}, nagle...), 128, 128 * 20000, false, false, 0},
			} {
				t.Run(tc.name, func(t *testing.T) {
					// A send's window, and the unit of sends judged.
					window := uint64(datapath.SmallWindow(tc.size, datapath.DefaultVerdictWindow))
					before := in.Counters()
					// stream fails unless the sink counted every byte,
					// pingpong unless every echo matched.
					run(t, cli, 2*time.Minute, in.Bin, append([]string{"peer"}, tc.args...)...)
					d := testutil.Delta(before, in.Counters())
					mustEqual(t, d, "conns_bypassed", 1)
					nodelay := uint64(0)
					if tc.nodelay && setting == "tcp" {
						nodelay = 1
					}
					mustEqual(t, d, "small_stream_nodelay", nodelay)
					if !tc.moves || setting == "bypass" {
						mustEqual(t, d, "fallback_small_stream", 0)
						// Less the window open at the close, whose
						// use is counted by sl_release.
						mustCarry(t, d, tc.sent-window)
						return
					}
					// The first send, then a window opened by each
					// verdict: the fifth window's verdict moves it at
					// the earliest. A window used up slowly (the
					// stream's start, or a writer preempted on a busy
					// machine) does not count, so the move may come
					// later, but within 78 units and the stream's first
					// half (a CI machine once took 55 windows of 4 KiB).
					mustEqual(t, d, "fallback_small_stream", 1)
					t.Logf("moved after %d bytes redirected: %d verdicts, %d windows", d["redirect_bytes"], d["redirect_msgs"], d["redirect_windows"])
					if tc.windows != 0 && d["redirect_windows"] > tc.windows {
						t.Errorf("%d verdict windows, want at most %d: the move was not judged on verdicts without windows (%s)", d["redirect_windows"], tc.windows, nonzero(d))
					}
					if r, lo, hi := d["redirect_bytes"], uint64(tc.size)+4*window, min(uint64(tc.size)+78*window, tc.sent/2); r < lo || r > hi {
						t.Errorf("%d bytes redirected before the move, want %d to %d (%s)", r, lo, hi, nonzero(d))
					}
					if d["pass_bytes"] == 0 {
						t.Errorf("nothing went through TCP after the move (%s)", nonzero(d))
					}
					// Both ends leave the map: the receiver once it read
					// what was redirected, the sender when it sees its
					// incoming direction moved too.
					deadline := time.Now().Add(10 * time.Second)
					for d["evictions"] < 2 && time.Now().Before(deadline) {
						time.Sleep(50 * time.Millisecond)
						d = testutil.Delta(before, in.Counters())
					}
					if d["evictions"] < 2 {
						t.Errorf("%d sockets left the map, want both (%s)", d["evictions"], nonzero(d))
					}
				})
			}
		})
	}
}
