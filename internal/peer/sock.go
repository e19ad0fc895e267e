// Package peer is socklane's traffic program: integrity streams, ping-pong
// and echo, over blocking or epoll-driven sockets. Tests, the demo and the
// benchmarks run it inside pods as `socklane peer`.
package peer

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// sock is one TCP connection driven either by blocking system calls or by
// Go's netpoller (epoll).
type sock interface {
	Read(p []byte) (int, error)
	Write(p []byte) (int, error)
	// Peek reads without consuming (MSG_PEEK), waiting for data.
	Peek(p []byte) (int, error)
	// Available is FIONREAD: bytes readable now.
	Available() (int, error)
	CloseWrite() error
	// Reset closes with SO_LINGER 0 (an RST).
	Reset() error
	Close() error
}

// blockingSock drives a file descriptor in blocking mode.
type blockingSock struct {
	fd int
	// retryAgain reads again after EAGAIN, which the kernel's sockmap
	// receive path returns to a blocking read that a signal interrupted
	// (the benchmark peers; the integrity peers report it).
	retryAgain bool
}

func (s *blockingSock) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(s.fd, p)
		if err == unix.EINTR || (err == unix.EAGAIN && s.retryAgain) {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, errEOF
		}
		return n, nil
	}
}

func (s *blockingSock) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		n, err := unix.Write(s.fd, p[done:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		done += n
	}
	return done, nil
}

func (s *blockingSock) Peek(p []byte) (int, error) {
	for {
		n, _, err := unix.Recvfrom(s.fd, p, unix.MSG_PEEK)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, errEOF
		}
		return n, nil
	}
}

func (s *blockingSock) Available() (int, error) {
	return unix.IoctlGetInt(s.fd, unix.SIOCINQ)
}

func (s *blockingSock) CloseWrite() error { return unix.Shutdown(s.fd, unix.SHUT_WR) }

func (s *blockingSock) Reset() error {
	if err := unix.SetsockoptLinger(s.fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0}); err != nil {
		return err
	}
	return s.Close()
}

func (s *blockingSock) Close() error { return unix.Close(s.fd) }

// pollSock drives a net.TCPConn (non-blocking fd, epoll).
type pollSock struct {
	c  *net.TCPConn
	rc syscall.RawConn
}

func newPollSock(c *net.TCPConn) (*pollSock, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	return &pollSock{c: c, rc: rc}, nil
}

func (s *pollSock) Read(p []byte) (int, error) {
	n, err := s.c.Read(p)
	if n == 0 && err != nil && errors.Is(err, errIOEOF) {
		return 0, errEOF
	}
	return n, err
}

func (s *pollSock) Write(p []byte) (int, error) { return s.c.Write(p) }

func (s *pollSock) Peek(p []byte) (int, error) {
	var n int
	var rerr error
	err := s.rc.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), p, unix.MSG_PEEK)
		return rerr != unix.EAGAIN
	})
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, rerr
	}
	if n == 0 {
		return 0, errEOF
	}
	return n, nil
}

func (s *pollSock) Available() (int, error) {
	var n int
	var ierr error
	err := s.rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	if err != nil {
		return 0, err
	}
	return n, ierr
}

func (s *pollSock) CloseWrite() error { return s.c.CloseWrite() }
func (s *pollSock) Reset() error {
	if err := s.c.SetLinger(0); err != nil {
		return err
	}
	return s.c.Close()
}
func (s *pollSock) Close() error { return s.c.Close() }

// dialBlocking connects a blocking socket to addr.
func dialBlocking(addr netip.AddrPort) (*blockingSock, error) {
	if addr.Addr().Is4() {
		return connectBlocking(unix.AF_INET, &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()}, addr.String())
	}
	return connectBlocking(unix.AF_INET6, &unix.SockaddrInet6{Port: int(addr.Port()), Addr: addr.Addr().As16()}, addr.String())
}

// connectBlocking connects a blocking stream socket of family to sa.
func connectBlocking(family int, sa unix.Sockaddr, addr string) (*blockingSock, error) {
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("creating socket: %w", err)
	}
	for {
		err = unix.Connect(fd, sa)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("connecting to %s: %w", addr, err)
	}
	return &blockingSock{fd: fd}, nil
}

// listener is a listening socket. A non-blocking one waits in poll(2), as
// event-driven servers do; a blocking one blocks in accept(2).
type listener struct {
	fd       int
	nonblock bool
	closed   atomic.Bool
}

// Listen opens a listening socket on addr ("ip:port" or "unix:PATH", a
// stale socket file being replaced); an unspecified IPv6 address is
// dual-stack, as Go's net.Listen(":port") and nginx make it.
func Listen(addr string, nonblock bool) (*listener, error) {
	var family int
	var sa unix.Sockaddr
	if network, path := splitAddr(addr); network == "unix" {
		_ = os.Remove(path)
		family, sa = unix.AF_UNIX, &unix.SockaddrUnix{Name: path}
	} else {
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			return nil, fmt.Errorf("parsing listen address %q: %w", addr, err)
		}
		family = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
		if ap.Addr().Is4() {
			family = unix.AF_INET
			sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
		}
	}
	typ := unix.SOCK_STREAM | unix.SOCK_CLOEXEC
	if nonblock {
		typ |= unix.SOCK_NONBLOCK
	}
	fd, err := unix.Socket(family, typ, 0)
	if err != nil {
		return nil, fmt.Errorf("creating socket: %w", err)
	}
	if family != unix.AF_UNIX {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			unix.Close(fd)
			return nil, err
		}
	}
	if family == unix.AF_INET6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
			unix.Close(fd)
			return nil, err
		}
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("binding %s: %w", addr, err)
	}
	if err := unix.Listen(fd, 1024); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	return &listener{fd: fd, nonblock: nonblock}, nil
}

// Accept waits for a connection. The socket is non-blocking from the start
// when asked, as an event-driven server (Go's net, nginx) makes it.
func (l *listener) Accept(nonblock bool) (int, error) {
	flags := unix.SOCK_CLOEXEC
	if nonblock {
		flags |= unix.SOCK_NONBLOCK
	}
	for {
		if l.closed.Load() {
			return -1, net.ErrClosed
		}
		fd, _, err := unix.Accept4(l.fd, flags)
		switch err {
		case unix.EINTR, unix.ECONNABORTED:
			continue
		case unix.EAGAIN:
			pfd := []unix.PollFd{{Fd: int32(l.fd), Events: unix.POLLIN}}
			_, _ = unix.Poll(pfd, 200)
			continue
		}
		return fd, err
	}
}

// Close stops accepting (a blocked Accept returns an error).
func (l *listener) Close() error {
	l.closed.Store(true)
	_ = unix.Shutdown(l.fd, unix.SHUT_RDWR)
	return unix.Close(l.fd)
}

// pollFromFD hands a socket to Go's netpoller.
func pollFromFD(fd int) (*pollSock, error) {
	f := os.NewFile(uintptr(fd), "accepted")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, err
	}
	return newPollSock(c.(*net.TCPConn))
}
