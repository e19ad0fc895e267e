package peer

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// TCP Fast Open socket options (linux/tcp.h).
const (
	tcpFastOpenConnect  = 30
	tcpFastOpenNoCookie = 34
)

// EchoFastOpen is Echo (netpoll) on a listener that accepts TCP Fast Open
// data in SYNs, with a queue of qlen.
func EchoFastOpen(ctx context.Context, addr string, qlen int, ready func(string)) error {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_FASTOPEN, qlen)
		}); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	ready(ln.Addr().String())
	bufs := newBufPool()
	return serveEach(ctx, ln, func(c net.Conn) { echoConn(c.(benchConn), bufs) })
}

// FastOpenReport is what the Fast Open clients saw.
type FastOpenReport struct {
	Conns  int      `json:"conns"`
	OK     int      `json:"ok"`
	Failed []string `json:"failed,omitempty"`
}

// FastOpenClients opens conns connections with TCP_FASTOPEN_CONNECT and
// TCP_FASTOPEN_NO_COOKIE (the first write goes out in the SYN, whether or
// not the server takes it), writes two distinct messages on each and
// checks that the echo comes back whole and in order.
func FastOpenClients(ctx context.Context, addr string, conns int) FastOpenReport {
	rep := FastOpenReport{Conns: conns}
	for i := range conns {
		if err := fastOpenConn(ctx, addr, i); err != nil {
			rep.Failed = append(rep.Failed, fmt.Sprintf("connection %d: %v", i, err))
			continue
		}
		rep.OK++
	}
	return rep
}

func fastOpenConn(ctx context.Context, addr string, i int) error {
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			if serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, tcpFastOpenConnect, 1); serr == nil {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, tcpFastOpenNoCookie, 1)
			}
		}); err != nil {
			return err
		}
		return serr
	}}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	first := bytes.Repeat([]byte{'A' + byte(i%13)}, 8)
	second := bytes.Repeat([]byte{'N' + byte(i%13)}, 8)
	for _, m := range [][]byte{first, second} {
		if _, err := c.Write(m); err != nil {
			return fmt.Errorf("writing: %w", err)
		}
	}
	want := append(append([]byte{}, first...), second...)
	got := make([]byte, 0, len(want))
	buf := make([]byte, 64)
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	for len(got) < len(want) {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			return fmt.Errorf("read %q, then: %w", got, err)
		}
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("echo %q, want %q", got, want)
	}
	return nil
}
