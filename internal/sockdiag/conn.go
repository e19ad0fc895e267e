package sockdiag

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// Conn is a sock_diag netlink socket. It answers for the network namespace
// it was opened in.
type Conn struct {
	fd  int
	seq uint32
	buf []byte
}

// Open opens a sock_diag socket in the caller's network namespace.
func Open() (*Conn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, fmt.Errorf("opening sock_diag netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("binding sock_diag netlink socket: %w", err)
	}
	return &Conn{fd: fd, buf: make([]byte, 64<<10)}, nil
}

// OpenIn opens a sock_diag socket in the network namespace at nsPath (a
// /proc/PID/ns/net or a bind mount of one). The calling goroutine's own
// namespace does not change.
func OpenIn(nsPath string) (*Conn, error) {
	ns, err := os.Open(nsPath)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	type result struct {
		c   *Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// The thread enters the namespace only to create the socket,
		// which stays bound to that namespace afterwards.
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("opening own network namespace: %w", err)}
			return
		}
		defer self.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("entering network namespace %s: %w", nsPath, err)}
			return
		}
		c, openErr := Open()
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: Go ends it with this goroutine.
			if c != nil {
				c.Close()
			}
			ch <- result{nil, fmt.Errorf("returning from network namespace %s: %w", nsPath, err)}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{c, openErr}
	}()
	r := <-ch
	return r.c, r.err
}

// Close closes the socket.
func (c *Conn) Close() error { return unix.Close(c.fd) }

// NetnsCookie is the cookie of the socket's network namespace, as BPF
// programs see it through bpf_get_netns_cookie.
func (c *Conn) NetnsCookie() (uint64, error) {
	v, err := unix.GetsockoptUint64(c.fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("reading network namespace cookie (Linux 5.14+): %w", err)
	}
	return v, nil
}

// roundTrip sends one request and reads until its end, collecting sockets.
func (c *Conn) roundTrip(typ, flags uint16, family, proto uint8, id ID) ([]Socket, error) {
	c.seq++
	if err := unix.Sendto(c.fd, request(typ, flags, c.seq, family, proto, id), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	var out []Socket
	for {
		n, _, err := unix.Recvfrom(c.fd, c.buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return out, err
		}
		socks, err := parse(c.buf[:n], proto)
		out = append(out, socks...)
		if errors.Is(err, errDone) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

// Dump lists the sockets of one family (AF_INET, AF_INET6) and protocol
// (IPPROTO_TCP, IPPROTO_UDP) in every state.
func (c *Conn) Dump(family, proto uint8) ([]Socket, error) {
	socks, err := c.roundTrip(unix.SOCK_DIAG_BY_FAMILY, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, family, proto, ID{})
	if err != nil {
		return nil, fmt.Errorf("dumping sockets (family %d, protocol %d): %w", family, proto, err)
	}
	return socks, nil
}

// ErrNoDestroy means the kernel was built without socket destruction.
var ErrNoDestroy = errors.New("kernel cannot destroy sockets (build it with CONFIG_INET_DIAG_DESTROY=y)")

// Destroy aborts one socket of a dump. It returns os.ErrNotExist if the
// socket is already gone (the cookie guards against a new socket with the
// same addresses).
func (c *Conn) Destroy(s Socket) error {
	_, err := c.roundTrip(unix.SOCK_DESTROY, unix.NLM_F_REQUEST|unix.NLM_F_ACK, s.Family, s.Protocol, s.ID)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.ENOENT):
		return os.ErrNotExist
	case errors.Is(err, syscall.EOPNOTSUPP):
		return ErrNoDestroy
	default:
		return fmt.Errorf("destroying socket %s -> %s: %w", s.Local(), s.Remote(), err)
	}
}
