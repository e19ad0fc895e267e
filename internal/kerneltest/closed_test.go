package kerneltest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/peer"
)

// runClosedRole runs the role of TestClosedBeforeClose; ok is false for
// any other role.
func runClosedRole(role string, args []string) (ok bool, err error) {
	if role != "hold-closed" { // ADDR N read|unread
		return false, nil
	}
	n, _ := strconv.Atoi(args[1])
	return true, holdClosed(args[0], n, args[2] == "read")
}

// holdClosed opens n connections to an echo at addr. On each it writes
// 1 KiB and half-closes; the echo answers and closes, and its FIN takes
// the socket to CLOSE while this process still holds it. With read, the
// echo is read before the half-close (and the end after it); else it is
// left unread, and read and checked once stdin has a line ("checked"
// then). Says "held N" once every socket is in CLOSE, and holds them until
// stdin ends.
func holdClosed(addr string, n int, read bool) error {
	var conns []*net.TCPConn
	var sent [][]byte
	for i := range n {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			return err
		}
		conns = append(conns, c.(*net.TCPConn))
		data := bytes.Repeat([]byte{byte('a' + i)}, 1024)
		sent = append(sent, data)
		if _, err := c.Write(data); err != nil {
			return fmt.Errorf("writing: %w", err)
		}
		if read {
			// The echo, before the half-close that ends it.
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.ReadFull(c, data); err != nil {
				return fmt.Errorf("reading the echo: %w", err)
			}
		}
		_ = c.(*net.TCPConn).CloseWrite()
		if read {
			if k, err := c.Read(data[:1]); k != 0 || err != io.EOF {
				return fmt.Errorf("reading the echo's end: %d bytes more, %v", k, err)
			}
		}
		if err := peer.WaitClosed(context.Background(), c.(*net.TCPConn)); err != nil {
			return err
		}
	}
	fmt.Println("held", len(conns))
	stdin := bufio.NewReader(os.Stdin)
	if !read {
		if _, err := stdin.ReadString('\n'); err != nil {
			return fmt.Errorf("waiting for the word to read: %w", err)
		}
		for i, c := range conns {
			if err := readEcho(c, sent[i]); err != nil {
				return fmt.Errorf("connection %d, read after it closed: %w", i, err)
			}
		}
		fmt.Println("checked")
	}
	_, _ = io.Copy(io.Discard, stdin)
	for _, c := range conns {
		c.Close()
	}
	return nil
}

// readEcho reads want's echo from c, then the end of the stream.
func readEcho(c net.Conn, want []byte) error {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("reading the echo: %w", err)
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("the echo differs from what was sent")
	}
	if k, err := c.Read(got[:1]); k != 0 || err != io.EOF {
		return fmt.Errorf("reading the echo's end: %d bytes more, %v", k, err)
	}
	return nil
}

// TestClosedBeforeClose is the attack on slot reuse by sockets that reach
// CLOSE before their close() (a half-close answered by the peer's FIN, or
// a peer's reset): such a socket stays in its socket map until its file
// is closed, under its slot's key. A pod that holds such sockets open must
// not leave that key taken while its slot goes to another connection,
// whose socket could then not join and would stay on TCP. The attacker
// holds conns sockets closed with their echo read, and conns closed with
// it unread; a victim's connections then take freed slots only (as on a
// node that used every fresh one). The evidence: every victim connection
// bypassed, no sockhash error; the read sockets left the map at their
// close callback; the unread ones lingered in their slots and still read
// every byte; and every slot is free once the attacker exits.
func TestClosedBeforeClose(t *testing.T) {
	const conns = 4
	// Brief connections bypassed: the victim's must not move to TCP for
	// the attacker's brief ones to the same destination.
	n := newNode(t, func(s *datapath.Settings) { s.BypassBrief = datapath.ModeOn })
	const addr = "127.0.0.1:7731"
	n.server("echo", addr)
	before := n.counters()
	// Fresh slots in order: the attacker's first, so that they are the
	// first the victim takes once it gets freed slots only.
	_, readOut := n.holdClosedRole(addr, conns, "read")
	unread, unreadOut := n.holdClosedRole(addr, conns, "unread")
	inMaps, err := n.dp.SocketsByMap()
	if err != nil {
		t.Fatal(err)
	}
	d := delta(before, n.counters())
	t.Logf("the attacker's sockets in CLOSE, held: in the maps %+v; counters %v", inMaps, d)
	if total := inMaps.Valve + inMaps.Plain; total > conns {
		t.Errorf("%d sockets in the maps, want at most the %d closed with their echo unread", total, conns)
	}
	if d["lingers"] != conns {
		t.Errorf("lingers %d, want the %d closed with their echo unread", d["lingers"], conns)
	}
	// Slots the victim can take besides the attacker's: freed by a round
	// of its own, after the attacker's.
	first := n.counters()
	n.client(addr, 2*conns, 16<<10)
	n.waitClosed(first, 4*conns)
	if err := n.dp.SpendFreshSlots(); err != nil {
		t.Fatal(err)
	}
	mid := n.counters()
	n.client(addr, 2*conns, 16<<10)
	// Their closes, where they were bypassed at all.
	var v map[string]uint64
	for i := 0; i < 250; i++ {
		if v = delta(mid, n.counters()); v["closed"] >= 4*conns {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the victim's connections on freed slots: %v", v)
	if v["conns_bypassed"] != 2*conns || v["err_sockhash"] != 0 || v["err_conn_table_full"] != 0 {
		t.Errorf("the victim's connections: %d bypassed, %d sockhash errors, %d with no slot; want %d bypassed, no errors",
			v["conns_bypassed"], v["err_sockhash"], v["err_conn_table_full"], 2*conns)
	}

	if _, err := unreadOut.w.Write([]byte("read\n")); err != nil {
		t.Fatal(err)
	}
	for i := 0; !strings.Contains(unreadOut.String(), "checked"); i++ {
		if i == 500 || unread.ProcessState != nil {
			t.Fatalf("the unread sockets were not read to their end: %s", unreadOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	readOut.w.Close()
	unreadOut.w.Close()
	// Every slot returns once the attacker's sockets are closed.
	for i := 0; ; i++ {
		free, err := n.dp.FreeSlots()
		if err != nil {
			t.Fatal(err)
		}
		got, err := n.dp.SocketsByMap()
		if err != nil {
			t.Fatal(err)
		}
		if free == n.dp.ConnSlots() && got == (datapath.SocketCounts{}) {
			break
		}
		if i == 250 {
			t.Fatalf("after the attacker exited: %d of %d slots free, sockets in the maps %+v", free, n.dp.ConnSlots(), got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// heldOutput is a held role's output and the write end of its stdin.
type heldOutput struct {
	*bytes.Buffer
	w *os.File
}

// holdClosedRole starts the hold-closed role and waits until it holds its
// sockets in CLOSE.
func (n *node) holdClosedRole(addr string, conns int, mode string) (*exec.Cmd, heldOutput) {
	n.t.Helper()
	return n.holdRole("hold-closed", addr, strconv.Itoa(conns), mode)
}

// holdRole starts role with a pipe for its stdin and waits until it says
// "held".
func (n *node) holdRole(role string, args ...string) (*exec.Cmd, heldOutput) {
	n.t.Helper()
	cmd, out, w := n.runPiped(role, args...)
	for i := 0; !strings.Contains(out.String(), "held"); i++ {
		if i == 500 || cmd.ProcessState != nil {
			n.t.Fatalf("%s %s: %s", role, strings.Join(args, " "), out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cmd, heldOutput{out, w}
}

// runPiped is run with a pipe for the role's stdin, whose write end it
// returns (closed at the test's end).
func (n *node) runPiped(role string, args ...string) (*exec.Cmd, *bytes.Buffer, *os.File) {
	n.t.Helper()
	// An *os.File: the role's exit ends its Wait with our end open.
	r, w, err := os.Pipe()
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { w.Close() })
	cmd, out := n.runWith(r, role, args...)
	r.Close()
	return cmd, out, w
}
