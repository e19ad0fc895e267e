package kerneltest

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/datapath"
)

// Heads of the streams the moody echo serves: a slow reader sleeps a
// second before its first read, a calm one echoes at once.
const (
	headSlow = 'S'
	headCalm = 'C'
)

// runCalmRole runs the roles of TestCalmDestination; ok is false for any
// other role.
func runCalmRole(role string, args []string) (ok bool, err error) {
	switch role {
	case "moody-echo": // ADDR: echo; a connection whose first byte is headSlow is read a second late
		return true, serveEcho(args[0], func(c net.Conn) {
			b := make([]byte, 1)
			if _, err := io.ReadFull(c, b); err != nil {
				return
			}
			if b[0] == headSlow {
				time.Sleep(time.Second)
			}
			_, _ = c.Write(b)
		})
	case "hold": // ADDR: 64 KiB echoed and checked, then "held", the connection open until stdin ends
		return true, hold(args[0])
	}
	return false, nil
}

// hold connects to addr, checks the echo of 64 KiB, says "held" and keeps
// the connection until its stdin ends; then half-closes and waits for the
// echo's close.
func hold(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	rng := rand.New(rand.NewPCG(7, 42))
	data := make([]byte, 64<<10)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	data[0] = headCalm
	if _, err := c.Write(data); err != nil {
		return fmt.Errorf("writing: %w", err)
	}
	got := make([]byte, len(data))
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("reading the echo: %w", err)
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("the echo differs from what was sent")
	}
	fmt.Println("held")
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = c.(*net.TCPConn).CloseWrite()
	if n, err := c.Read(got[:1]); n != 0 || err != io.EOF {
		return fmt.Errorf("reading the echo's end: %d bytes more, %v", n, err)
	}
	return nil
}

// TestCalmDestination: with the valve on and --calm-destinations plain, a
// namespace's connections to a destination join the valve's socket map
// (its sk_skb verdict puts every read on the kernel's parser receive path)
// until SL_CALM_LEARN of them in a row closed with nothing through TCP;
// its next ones join the plain map, whose reads are TCP's own. A slow
// reader there moves its direction to TCP (the backlog rule) with every
// byte intact, and the next connection joins the valve's map again. With
// --calm-destinations valve (the default) every connection joins the
// valve's map; without the valve (6.1) every connection joins the plain
// map. The evidence: the sockets each map holds while a connection is held
// open, and the counters.
func TestCalmDestination(t *testing.T) {
	for i, plain := range []bool{true, false} {
		t.Run(fmt.Sprintf("calm-destinations %v", map[bool]string{true: "plain", false: "valve"}[plain]), func(t *testing.T) {
			calmRun(t, fmt.Sprintf("127.0.0.1:%d", 7712+i), plain)
		})
	}
}

func calmRun(t *testing.T, addr string, learn bool) {
	// A limit the slow reader's writer passes in a fraction of its
	// reader's second of sleep.
	n := newNode(t, func(s *datapath.Settings) {
		s.BacklogLimit = 1 << 20
		s.CalmPlain = map[bool]datapath.Mode{true: datapath.ModeOn, false: datapath.ModeOff}[learn]
		// Learning calm destinations is what --reader-verdict join has.
		s.LateVerdict = datapath.ModeOff
	})
	st, err := n.dp.Settings()
	if err != nil {
		t.Fatal(err)
	}
	valve := st.BacklogValve.On()
	n.server("moody-echo", addr)

	type step struct {
		name      string
		slow      bool // the moody echo reads it a second late
		wantPlain bool // with the valve on, and learning
	}
	var steps []step
	// SL_CALM_LEARN, from the generated constant.
	for i := range int(datapath.CalmLearn) {
		steps = append(steps, step{name: fmt.Sprintf("calm connection %d of %d", i+1, datapath.CalmLearn)})
	}
	steps = append(steps,
		step{name: "learned calm", wantPlain: true},
		step{name: "slow reader on the plain map", slow: true, wantPlain: true},
		step{name: "after the slow reader"},
	)
	for _, s := range steps {
		before := n.counters()
		plain := s.wantPlain && valve && learn
		if s.slow {
			n.clientArgs(addr, "1", strconv.Itoa(8<<20), strconv.Itoa(16<<10), string(rune(headSlow)))
		} else {
			n.holdOpen(addr, func() {
				got, err := n.dp.SocketsByMap()
				if err != nil {
					t.Fatal(err)
				}
				want := datapath.SocketCounts{Valve: 2}
				if plain || !valve {
					want = datapath.SocketCounts{Plain: 2}
				}
				if got != want {
					t.Errorf("%s: the held connection's sockets are in the maps %+v, want %+v", s.name, got, want)
				}
			})
		}
		d := n.waitClosed(before, 2)
		// Closed, they left sl_skb's sequences (a slow reader's TCP
		// bytes made entries there).
		// A socket closed by its peer before its close() (it lingers)
		// leaves them at its close(), which may come after the count.
		if seqs, err := n.waitSkbSeqsEmpty(); err != nil || seqs != 0 {
			t.Errorf("%s: sl_skb_seqs follows %d sockets after both closed, want none (%v)", s.name, seqs, err)
		}
		if got, want := d["conns_plain"], map[bool]uint64{true: 1}[plain]; got != want {
			t.Errorf("%s: conns_plain %d, want %d: %v", s.name, got, want, d)
		}
		if d["conns_bypassed"] != 1 {
			t.Errorf("%s: %d connections bypassed, want 1: %v", s.name, d["conns_bypassed"], d)
		}
		// The slow reader's writer: on the plain map its direction
		// moved to TCP, nothing passed by a valve; on the valve's map
		// the valve pushed it back instead.
		switch {
		case s.slow && plain && (d["fallback_backlog"] == 0 || d["valve_opens"] != 0):
			t.Errorf("%s: %d moves to TCP for the backlog, %d valve openings: want a move and no valve", s.name, d["fallback_backlog"], d["valve_opens"])
		case s.slow && valve && !plain && (d["fallback_backlog"] != 0 || d["valve_opens"] == 0):
			t.Errorf("%s: %d moves to TCP for the backlog, %d valve openings: want the valve and no move", s.name, d["fallback_backlog"], d["valve_opens"])
		case !s.slow && d["pass_msgs"] != 0:
			t.Errorf("%s: %d messages through TCP, want none: %v", s.name, d["pass_msgs"], d)
		}
		t.Logf("%s: %v", s.name, d)
	}
}

// holdOpen runs the hold role to addr and calls check while its
// connection is open.
func (n *node) holdOpen(addr string, check func()) {
	n.t.Helper()
	r, w := io.Pipe()
	cmd, out := n.runWith(r, "hold", addr)
	defer w.Close()
	for i := 0; !strings.Contains(out.String(), "held"); i++ {
		if i == 500 || cmd.ProcessState != nil {
			n.t.Fatalf("the held connection did not come up: %s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	check()
	w.Close()
	if err := cmd.Wait(); err != nil {
		n.t.Fatalf("hold: %v: %s", err, out.String())
	}
}

// waitSkbSeqsEmpty waits, two seconds at most, for sl_skb_seqs to follow
// no socket, and returns how many it follows.
func (n *node) waitSkbSeqsEmpty() (int, error) {
	for i := 0; ; i++ {
		seqs, err := n.dp.SkbSeqs()
		if err != nil || seqs == 0 || i == 100 {
			return seqs, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitClosed waits until closed sockets since before reach want, and
// returns the counters' change.
func (n *node) waitClosed(before map[string]uint64, want uint64) map[string]uint64 {
	n.t.Helper()
	var d map[string]uint64
	for i := 0; i < 250; i++ {
		if d = delta(before, n.counters()); d["closed"] >= want {
			return d
		}
		time.Sleep(20 * time.Millisecond)
	}
	n.t.Fatalf("%d sockets closed, want %d: %v", d["closed"], want, d)
	return d
}
