package kerneltest

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"time"
)

// Heads of the streams the moody echo serves: a slow reader sleeps a
// second before its first read, a calm one echoes at once.
const (
	headSlow = 'S'
	headCalm = 'C'
)

// runMoodyRole runs the roles of TestReaderVerdictLate; ok is false for
// any other role.
func runMoodyRole(role string, args []string) (ok bool, err error) {
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
