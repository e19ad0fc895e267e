package peer

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// Open opens count TCP connections to ip, spread over ports, and holds
// them until ctx ends: idle connections by the thousand, as a node has
// them. With closed, each then sends a byte to its server (an echo) and
// half-closes, and is held once the echo's answer and FIN have taken it to
// CLOSE with that answer unread: connections over but for their files. It
// calls ready once all are open, and closes them at the end.
func Open(ctx context.Context, ip netip.Addr, ports []uint16, count int, closed bool, ready func(int)) error {
	if len(ports) == 0 || count < 1 {
		return fmt.Errorf("open: want at least one port and one connection")
	}
	// Go raises the soft open-file limit to the hard one at start.
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < uint64(count)+64 {
		return fmt.Errorf("%d connections need more open files than this process may have (%d): open them from several processes", count, lim.Cur)
	}
	conns := make([]net.Conn, 0, count)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	d := net.Dialer{Timeout: 5 * time.Second}
	for i := range count {
		target := netip.AddrPortFrom(ip, ports[i%len(ports)])
		c, err := d.DialContext(ctx, "tcp", target.String())
		if err != nil {
			return fmt.Errorf("connection %d of %d to %s: %w", i+1, count, target, err)
		}
		conns = append(conns, c)
	}
	if closed {
		for i, c := range conns {
			if _, err := c.Write([]byte{1}); err != nil {
				return fmt.Errorf("connection %d: writing: %w", i+1, err)
			}
			if err := c.(*net.TCPConn).CloseWrite(); err != nil {
				return fmt.Errorf("connection %d: half-closing: %w", i+1, err)
			}
		}
		for i, c := range conns {
			if err := WaitClosed(ctx, c.(*net.TCPConn)); err != nil {
				return fmt.Errorf("connection %d: %w", i+1, err)
			}
		}
	}
	ready(len(conns))
	<-ctx.Done()
	return nil
}

// WaitClosed waits up to 10 s for c's TCP state to be CLOSE: its peer's
// FIN or reset ended the connection, with c's file still open.
func WaitClosed(ctx context.Context, c *net.TCPConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	for end := time.Now().Add(10 * time.Second); ctx.Err() == nil && time.Now().Before(end); time.Sleep(time.Millisecond) {
		var info *unix.TCPInfo
		_ = raw.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
		if err != nil {
			return fmt.Errorf("reading TCP_INFO: %w", err)
		}
		if info.State == tcpStateClose {
			return nil
		}
	}
	return fmt.Errorf("not closed by its peer in 10 s")
}

// tcpStateClose is TCP_CLOSE in TCP_INFO's state.
const tcpStateClose = 7

// ListenMany listens on every port of ip and holds the listeners until ctx
// ends, calling ready with their number once all listen.
func ListenMany(ctx context.Context, ip netip.Addr, ports []uint16, ready func(int)) error {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < uint64(len(ports))+64 {
		return fmt.Errorf("%d listeners need more open files than this process may have (%d)", len(ports), lim.Cur)
	}
	lns := make([]net.Listener, 0, len(ports))
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	for _, p := range ports {
		l, err := net.Listen("tcp", netip.AddrPortFrom(ip, p).String())
		if err != nil {
			return fmt.Errorf("listening on port %d: %w", p, err)
		}
		lns = append(lns, l)
	}
	ready(len(lns))
	<-ctx.Done()
	return nil
}
