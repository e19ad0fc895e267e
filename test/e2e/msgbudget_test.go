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
// own, not by the writes. The same with a 64 KiB write after the first,
// whose verdict window would otherwise cover the next 192 Ki 1-byte writes
// unseen. Once
// the sink reads, every byte arrives.
func TestMessageBudget(t *testing.T) {
	const (
		limit  = 4 << 20  // --backlog-limit
		budget = 4096     // limit / SL_MSG_COST
		writes = 200000   // 1-byte writes: 200 MB of slab at a KiB each
		slack  = 24 << 20 // the budget's 4 MiB (8 through the grace), TCP's, the machine's
	)
	for i, tc := range []struct {
		name, mode string
		large      int // a write of this size after the first
	}{
		{"valve", "valve", 0},
		{"valve, after a 64 KiB write", "valve", 64 << 10},
		{"tcp", "tcp", 0},
		{"tcp, after a 64 KiB write", "tcp", 64 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The kernel matrix runs -test.short: the rows after a large
			// write take every rule the others do (emulated, a row is a
			// minute and more).
			if testing.Short() && tc.large == 0 {
				t.Skip("-test.short: the row after a 64 KiB write covers the budget and the window")
			}
			if tc.mode == "valve" && !valveKernel(t) {
				t.Skip("the valve needs Linux 6.13 (TestSlowReaderValve checks it is refused)")
			}
			_, in, srv, cli := serverClient(t, "--slow-readers", tc.mode, "--backlog-limit", fmt.Sprint(limit))
			if !readStatus(t, in).Kernel.PsockMsgTotLen {
				t.Skip("this kernel's sk_psock does not count queued bytes: the bypass is off by default, and no rule sees a reader's queue")
			}
			port := uint16(7470 + i)
			listen := fmt.Sprintf("0.0.0.0:%d", port)
			start(t, srv, in.Bin, "peer", "sink", listen, "--delay", "8s")
			waitPort(t, srv, listen)
			slab := unreclaimableSlab(t)
			before := in.Counters()
			st := start(t, cli, in.Bin, "peer", "stream", netip.AddrPortFrom(srv.IPv4, port).String(),
				"--size", "1", "--count", fmt.Sprint(writes), "--nodelay", "1", "--large", fmt.Sprint(tc.large))
			// The writer stops once held back; wait until the counters
			// stand still (the sink reads only after 8 s).
			var d map[string]uint64
			var sent uint64
			for i := 0; i < 50; i++ {
				time.Sleep(100 * time.Millisecond)
				d = testutil.Delta(before, in.Counters())
				n := d["redirect_bytes"] + d["pass_bytes"]
				if i >= 5 && n == sent {
					break
				}
				sent = n
			}
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
			}
			// stream fails unless the sink counted every byte sent.
			if err := st.wait(t, time.Minute); err != nil {
				t.Fatalf("stream: %v: %s", err, st.err.String())
			}
		})
	}
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
