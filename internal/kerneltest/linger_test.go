package kerneltest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/sockbugs"
)

// runLingerRole runs the roles of TestResetWhileUnread; ok is false for
// any other role.
func runLingerRole(role string, args []string) (ok bool, err error) {
	switch role {
	case "reset-writer": // ADDR BYTES: writes up to BYTES of a seeded stream for a second, then resets
		size, _ := strconv.Atoi(args[1])
		return true, resetWriter(args[0], size)
	case "fionread-reader": // ADDR: reads one connection by FIONREAD once stdin has a line, then holds it until stdin ends
		return true, fionreadReader(args[0])
	case "late-acceptor": // ADDR N: accepts N connections once stdin has a line, reads each to its end, then holds them until stdin ends
		n, _ := strconv.Atoi(args[1])
		return true, lateAcceptor(args[0], n)
	}
	return false, nil
}

// lingerStream is the stream the reset writer sends and its reader checks.
func lingerStream(size int) []byte {
	rng := rand.New(rand.NewPCG(11, 42))
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// resetWriter writes as much of size bytes as its peer takes in a second,
// then closes with SO_LINGER 0: its peer is reset with what it has not
// read still queued. Prints how much it wrote.
func resetWriter(addr string, size int) error {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return err
	}
	data := lingerStream(size)
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	n, err := c.Write(data)
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("writing: %w", err)
	}
	if err := c.(*net.TCPConn).SetLinger(0); err != nil {
		return err
	}
	fmt.Printf("wrote %d\n", n)
	return c.Close()
}

// fionreadReader accepts one connection, waits for a line on stdin, then
// reads it the way a program that sizes its reads by FIONREAD does:
// FIONREAD, then a read of that much. Where FIONREAD says 0 it peeks: bytes
// that a peek finds and FIONREAD does not count for 2 s are an error (such
// a program would wait for them forever). Checks every byte against the
// stream, prints how much it read and the longest time FIONREAD missed
// bytes, and holds the connection open until stdin ends.
func fionreadReader(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Println("listening")
	c, err := ln.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	stdin := bufio.NewReader(os.Stdin)
	if _, err := stdin.ReadString('\n'); err != nil {
		return fmt.Errorf("waiting for the word to read: %w", err)
	}
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return err
	}
	want := lingerStream(64 << 20)
	buf := make([]byte, 1<<20)
	var got int
	var missed, worst time.Duration
	var missedSince time.Time
	for end := time.Now().Add(30 * time.Second); ; {
		if time.Now().After(end) {
			return fmt.Errorf("read %d bytes in 30 s and the connection has not ended", got)
		}
		var inq, n int
		var rerr, perr error
		_ = raw.Control(func(fd uintptr) {
			inq, rerr = unix.IoctlGetInt(int(fd), unix.SIOCINQ)
			if rerr != nil || inq > 0 {
				return
			}
			n, _, perr = unix.Recvfrom(int(fd), buf[:1], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		})
		if rerr != nil {
			return fmt.Errorf("FIONREAD: %w", rerr)
		}
		if inq == 0 {
			switch {
			case perr == nil && n > 0: // bytes FIONREAD does not count
				if missedSince.IsZero() {
					missedSince = time.Now()
				}
				if missed = time.Since(missedSince); missed > 2*time.Second {
					return fmt.Errorf("FIONREAD 0 for %v while MSG_PEEK finds bytes, after %d bytes read", missed, got)
				}
				time.Sleep(time.Millisecond)
				continue
			case perr == nil || errors.Is(perr, syscall.ECONNRESET): // the end: EOF or the reset
				fmt.Printf("read %d missed %d\n", got, worst.Milliseconds())
				_, _ = io.Copy(io.Discard, stdin)
				return nil
			case errors.Is(perr, syscall.EAGAIN):
				time.Sleep(time.Millisecond)
				continue
			default:
				return fmt.Errorf("MSG_PEEK after %d bytes: %w", got, perr)
			}
		}
		if !missedSince.IsZero() {
			worst = max(worst, missed)
			missedSince = time.Time{}
		}
		n, err := c.Read(buf[:min(inq, len(buf))])
		if err != nil {
			return fmt.Errorf("reading %d bytes FIONREAD counted after %d: %w", inq, got, err)
		}
		if got+n > len(want) || string(buf[:n]) != string(want[got:got+n]) {
			return fmt.Errorf("the %d bytes read after %d differ from what was sent", n, got)
		}
		got += n
	}
}

// TestResetWhileUnread: a receiver on the plain socket map (no verdict:
// --slow-readers tcp) that does not read while its writer passes the
// backlog limit has its direction moved to TCP, with what was redirected
// still queued in its psock. The writer then resets it: it reaches CLOSE
// still in the map (the kernel has no sockmap unhash handler), where
// FIONREAD counts only the psock's queue. It lingers: its timer takes it
// out once the psock's queue is read, so that FIONREAD counts the bytes
// TCP holds behind it. The evidence: the reader's FIONREAD reads every
// byte, in order, with no 2 s where FIONREAD missed bytes a peek found
// (the build before the linger fails here on 6.18); the lingers counter;
// and the map holds no socket while the reader still holds its connection
// open, unless FIONREAD never missed a byte (6.12, above).
func TestResetWhileUnread(t *testing.T) {
	n := newNode(t, func(s *datapath.Settings) {
		s.BacklogValve = datapath.ModeOff
		s.BacklogLimit = 1 << 20
	})
	f := n.dp.Features()
	for _, b := range f.Bugs {
		if b.Name == sockbugs.FIONREAD {
			t.Skipf("FIONREAD counts no redirected byte on %s: no reader here sizes its reads by it", kernel())
		}
	}
	const addr = "127.0.0.1:7720"
	before := n.counters()
	reader := n.listenPiped("fionread-reader", addr)
	out, w, exited := reader.out, reader.w, reader.exited
	wcmd, wout := n.run("reset-writer", addr, strconv.Itoa(64<<20))
	if err := wcmd.Wait(); err != nil {
		t.Fatalf("reset-writer: %v: %s", err, wout.String())
	}
	// The reset is processed as the writer closes (loopback); then the
	// reader reads.
	if _, err := w.Write([]byte("read\n")); err != nil {
		t.Fatal(err)
	}
	reader.waitRead()
	d := delta(before, n.counters())
	got, err := n.dp.SocketsByMap()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("writer: %s reader: %s counters: %v", strings.TrimSpace(wout.String()), strings.TrimSpace(out.String()), d)
	if d["fallback_backlog"] == 0 {
		t.Fatalf("the writer's direction never moved to TCP for the backlog: %v", d)
	}
	if d["lingers"] != 1 {
		t.Errorf("lingers %d: want the reset reader, with redirected bytes unread, to linger once", d["lingers"])
	}
	// Out of the map once its psock's queue was read. On 6.12 that
	// queue's byte count (sk_psock.msg_tot_len) stays above 0 after every
	// byte was read, so the timer never finds it empty and the socket
	// stays until its close(); that kernel's FIONREAD counts TCP's bytes
	// in the map (the reader above never found it missing any), so nothing
	// waits for it.
	if got != (datapath.SocketCounts{}) {
		if !strings.Contains(out.String(), "missed 0\n") {
			t.Errorf("the reader's socket, closed by the reset and still open, is in the maps %+v, want none", got)
		} else {
			t.Logf("the reader's socket stays in the maps %+v on %s, whose FIONREAD counted TCP's bytes there", got, kernel())
		}
	}
	w.Close()
	if err := <-exited; err != nil {
		t.Fatalf("fionread-reader: %v: %s", err, out.String())
	}
}

// lateAcceptor listens on addr and, once stdin has a line, accepts n
// connections and reads each to its end (EOF or a reset), checking that
// what it read is a prefix of the reset writer's stream. Says "read N"
// with the bytes read over all, then holds the connections open until
// stdin ends.
func lateAcceptor(addr string, n int) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Println("listening")
	stdin := bufio.NewReader(os.Stdin)
	if _, err := stdin.ReadString('\n'); err != nil {
		return fmt.Errorf("waiting for the word to accept: %w", err)
	}
	want := lingerStream(lateWriterBytes)
	buf := make([]byte, 256<<10)
	total := 0
	for i := range n {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got := 0
		for {
			k, err := c.Read(buf)
			if got+k > len(want) || string(buf[:k]) != string(want[got:got+k]) {
				return fmt.Errorf("connection %d: the %d bytes read after %d differ from what was sent", i, k, got)
			}
			got += k
			if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
				break
			}
			if err != nil {
				return fmt.Errorf("connection %d, after %d bytes: %w", i, got, err)
			}
		}
		total += got
	}
	fmt.Printf("read %d\n", total)
	_, _ = io.Copy(io.Discard, stdin)
	return nil
}

// lateWriterBytes is what each reset writer of TestResetBeforeAccept
// offers: more than its reader's buffers take.
const lateWriterBytes = 8 << 20

// TestResetBeforeAccept is the attack on sl_skb_seqs, the valve's table of
// where TCP's last segment to each socket ended: sized per socket and
// shared by every pod, and once full the verdict can cut no one's
// retransmission heads (err_skb_trim), whose bytes then arrive twice. A
// socket's close callback removes its entry; TCP's segments that reached
// a socket not yet accepted wait in its receive queue (the verdict needs
// the socket's file), and the first read after accept() hands them to the
// verdict, which makes the entry again, after that callback. The attacker
// owns both ends: conns writers each write to a listener that does not
// accept yet until the valve passes their sends through TCP, then reset
// their connection; each accepted socket reaches CLOSE before accept()
// with redirected bytes unread, and lingers. The listener then accepts,
// reads every byte and holds the sockets open, then closes them. The
// evidence: the entries their reads made while held (the attack ran),
// none left once the sockets are closed, and every byte read in order.
// Both ways a reader gets the verdict: as it joins, and late, once its
// writer found 64 KiB queued for it. The backlog limit sets the valve's
// floor (half of it): low, so the valve opens before the writers' 8 MiB
// are queued; given late, high enough that the backlog rule (at twice
// it) does not move the direction to TCP before the join.
func TestResetBeforeAccept(t *testing.T) {
	for _, tc := range []struct {
		name  string
		late  datapath.Mode
		limit uint32
		addr  string
	}{
		{"verdict at join", datapath.ModeOff, 64 << 10, "127.0.0.1:7721"},
		{"verdict given late", datapath.ModeOn, 2 << 20, "127.0.0.1:7722"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resetBeforeAccept(t, tc.addr, func(s *datapath.Settings) { s.BacklogLimit, s.LateVerdict = tc.limit, tc.late })
		})
	}
}

func resetBeforeAccept(t *testing.T, addr string, set func(*datapath.Settings)) {
	const conns = 8
	n := newNode(t, set)
	n.requireValve("no sk_skb verdict, no sl_skb_seqs to fill")
	st, err := n.dp.Settings()
	if err != nil {
		t.Fatal(err)
	}
	before := n.counters()
	acceptor := n.listenPiped("late-acceptor", addr, strconv.Itoa(conns))
	out, w, exited := acceptor.out, acceptor.w, acceptor.exited
	var writers []*exec.Cmd
	var wouts []*bytes.Buffer
	for range conns {
		cmd, wout := n.run("reset-writer", addr, strconv.Itoa(lateWriterBytes))
		writers, wouts = append(writers, cmd), append(wouts, wout)
	}
	for i, cmd := range writers {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("reset-writer: %v: %s", err, wouts[i].String())
		}
	}
	reset := delta(before, n.counters())
	seqsReset, err := n.dp.SkbSeqs()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reset before accept: sl_skb_seqs follows %d; %v", seqsReset, reset)
	if reset["lingers"] != conns || reset["valve_opens"] == 0 || reset["pass_msgs"] == 0 {
		t.Fatalf("lingers %d (want %d), valve openings %d, messages through TCP %d: want every reset socket lingering with TCP's bytes waiting",
			reset["lingers"], conns, reset["valve_opens"], reset["pass_msgs"])
	}
	if late := reset["late_verdicts"]; st.LateVerdict.On() != (late == conns) || (!st.LateVerdict.On() && late != 0) {
		t.Fatalf("late_verdicts %d with the late verdict %v: want each reader given it late (%d), or none", late, st.LateVerdict.On(), conns)
	}
	// The lingering readers, in the maps until read.
	inMaps, err := n.dp.SocketsByMap()
	if err != nil {
		t.Fatal(err)
	}
	want := datapath.SocketCounts{Valve: conns}
	if st.LateVerdict.On() {
		want = datapath.SocketCounts{Plain: conns, Late: conns}
	}
	if inMaps != want {
		t.Errorf("the reset connections' readers, not accepted: in the maps %+v, want %+v", inMaps, want)
	}
	if _, err := w.Write([]byte("accept\n")); err != nil {
		t.Fatal(err)
	}
	acceptor.waitRead()
	seqsHeld, err := n.dp.SkbSeqs()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("accepted and read (%s): sl_skb_seqs follows %d", strings.TrimSpace(out.String()), seqsHeld)
	if seqsHeld == 0 {
		t.Errorf("sl_skb_seqs follows no socket after the reads: TCP's waiting segments did not reach the verdict after the close callbacks")
	}
	w.Close()
	if err := <-exited; err != nil {
		t.Fatalf("late-acceptor: %v: %s", err, out.String())
	}
	seqs, err := n.waitSkbSeqsEmpty()
	if err != nil {
		t.Fatal(err)
	}
	d := delta(before, n.counters())
	t.Logf("closed: sl_skb_seqs follows %d; %v", seqs, d)
	if seqs != 0 {
		t.Errorf("sl_skb_seqs follows %d sockets after the attacker's closed, want none: nothing else removes such an entry, so each such connection would keep one for good", seqs)
	}
	if d["err_skb_trim"] != 0 {
		t.Errorf("err_skb_trim %d, want 0", d["err_skb_trim"])
	}
}

// pipedRole is a listening role started with a pipe for its stdin.
type pipedRole struct {
	t      *testing.T
	role   string
	out    *bytes.Buffer
	w      *os.File
	exited chan error // its Wait's result
}

// listenPiped starts role with a pipe for its stdin and waits until it
// listens.
func (n *node) listenPiped(role string, args ...string) pipedRole {
	n.t.Helper()
	cmd, out, w := n.runPiped(role, args...)
	p := pipedRole{t: n.t, role: role, out: out, w: w, exited: make(chan error, 1)}
	go func() { p.exited <- cmd.Wait() }()
	for i := 0; !strings.Contains(out.String(), "listening"); i++ {
		if i == 500 {
			n.t.Fatalf("%s did not listen: %s", role, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p
}

// waitRead waits, a minute at most, until the role says it read to the
// end ("read ...").
func (p pipedRole) waitRead() {
	p.t.Helper()
	for deadline := time.After(time.Minute); !strings.Contains(p.out.String(), "read "); {
		select {
		case err := <-p.exited:
			p.t.Fatalf("%s ended before it read to the end: %v: %s", p.role, err, p.out.String())
		case <-deadline:
			p.t.Fatalf("%s did not finish in a minute: %s", p.role, p.out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
