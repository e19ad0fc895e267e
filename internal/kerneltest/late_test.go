package kerneltest

import (
	"strconv"
	"testing"

	"github.com/socklane/socklane/internal/datapath"
)

// TestReaderVerdictLate: with --reader-verdict late (the default where
// the valve runs), connections join the plain socket map, whose reads
// take the kernel's plain receive path, and a reader gets the valve's
// verdict only when its writer finds it behind, from the kernel (a timer
// whose callback belongs to a tc program). With --reader-verdict join
// every socket joins the valve's map and has it from the start. The
// evidence: a calm connection's sockets are in the plain map (join: the
// valve's) and no reader was given the verdict; a slow reader (the moody
// echo reads a second late) was given it (join: had it), its writer was
// pushed back by the valve rather than moved to TCP, and every byte of 8
// MiB came back in order; once closed, no socket is left in the maps and
// sl_skb_seqs follows none.
func TestReaderVerdictLate(t *testing.T) {
	for i, late := range []datapath.Mode{datapath.ModeOn, datapath.ModeOff} {
		t.Run("reader-verdict "+map[datapath.Mode]string{datapath.ModeOn: "late", datapath.ModeOff: "join"}[late], func(t *testing.T) {
			readerVerdict(t, "127.0.0.1:"+strconv.Itoa(7740+i), late)
		})
	}
}

func readerVerdict(t *testing.T, addr string, late datapath.Mode) {
	n := newNode(t, func(s *datapath.Settings) {
		s.BacklogLimit = 1 << 20
		s.LateVerdict = late
	})
	n.requireValve("no verdict to give late")
	n.server("moody-echo", addr)

	before := n.counters()
	n.holdOpen(addr, func() {
		got, err := n.dp.SocketsByMap()
		if err != nil {
			t.Fatal(err)
		}
		want := datapath.SocketCounts{Plain: 2}
		if !late.On() {
			want = datapath.SocketCounts{Valve: 2}
		}
		if got != want {
			t.Errorf("a calm connection's sockets are in the maps %+v, want %+v", got, want)
		}
	})
	d := n.waitClosed(before, 2)
	t.Logf("calm: readers given the verdict %d, messages through TCP %d", d["late_verdicts"], d["pass_msgs"])
	if d["late_verdicts"] != 0 || d["conns_bypassed"] != 1 || d["pass_msgs"] != 0 {
		t.Errorf("a calm connection: %d readers given the verdict, %d bypassed, %d messages through TCP; want 0, 1, 0", d["late_verdicts"], d["conns_bypassed"], d["pass_msgs"])
	}

	before = n.counters()
	n.clientArgs(addr, "1", strconv.Itoa(8<<20), strconv.Itoa(16<<10), string(rune(headSlow)))
	d = n.waitClosed(before, 2)
	t.Logf("slow reader: readers given the verdict %d, valve openings %d, bytes it passed %d, moves to TCP %d, overlaps cut %d",
		d["late_verdicts"], d["valve_opens"], d["valve_bytes"], d["fallback_backlog"], d["skb_overlaps"])
	// Late: its server at least, and its client too where the echo got
	// ahead of it. Join: none, every socket had it.
	if (late.On() && d["late_verdicts"] == 0) || (!late.On() && d["late_verdicts"] != 0) || d["err_late_verdict"] != 0 {
		t.Errorf("the slow reader: %d readers given the verdict, %d could not be; want at least 1 (none with join), and 0", d["late_verdicts"], d["err_late_verdict"])
	}
	if d["valve_opens"] == 0 || d["fallback_backlog"] != 0 {
		t.Errorf("the slow reader's writer: %d valve openings, %d moves to TCP for the backlog; want the valve and no move", d["valve_opens"], d["fallback_backlog"])
	}
	if seqs, err := n.waitSkbSeqsEmpty(); err != nil || seqs != 0 {
		t.Errorf("sl_skb_seqs follows %d sockets after both closed, want none (%v)", seqs, err)
	}
	if got, err := n.dp.SocketsByMap(); err != nil || got != (datapath.SocketCounts{}) {
		t.Errorf("after both closed, sockets in the maps %+v (%v), want none", got, err)
	}
}

// requireValve skips the test, saying why, where the node's datapath runs
// without the valve (kernels that do not charge redirected bytes to their
// reader: 6.1); what names what the test then has nothing of.
func (n *node) requireValve(what string) {
	n.t.Helper()
	st, err := n.dp.Settings()
	if err != nil {
		n.t.Fatal(err)
	}
	if !st.BacklogValve.On() {
		n.t.Skipf("the valve does not run on %s (the kernel does not charge redirected bytes to their reader): %s", kernel(), what)
	}
}
