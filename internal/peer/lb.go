package peer

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Whoami serves label on addr: over TCP, to each connection, which it
// then keeps open until the client closes it; over UDP, in reply to each
// datagram (from the address it came to).
func Whoami(ctx context.Context, network, addr, label string) error {
	return WhoamiAfter(ctx, network, addr, label, 0)
}

// WhoamiAfter is Whoami answering each UDP datagram delay after it came
// (an exchange that stays open for a while).
func WhoamiAfter(ctx context.Context, network, addr, label string, delay time.Duration) error {
	switch network {
	case "tcp":
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		return serveEach(ctx, ln, func(c net.Conn) {
			if _, err := c.Write([]byte(label)); err == nil {
				_, _ = io.Copy(io.Discard, c)
			}
		})
	case "udp":
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return err
		}
		go func() { <-ctx.Done(); pc.Close() }()
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			reply := []byte(label)
			if bytes.HasPrefix(buf[:n], []byte(fanoutTag)) {
				// A fanout request: answered with itself, so that the
				// client knows which of its sends this answers.
				reply = append(append(reply, ' '), buf[:n]...)
			}
			if delay == 0 {
				_, _ = pc.WriteTo(reply, from)
				continue
			}
			time.AfterFunc(delay, func() { _, _ = pc.WriteTo(reply, from) })
		}
	}
	return fmt.Errorf("network %q: want tcp or udp", network)
}

// LBProbe is what a client saw through a service address.
type LBProbe struct {
	Replies map[string]int `json:"replies"` // backend label -> count
	// PeerMismatch counts sockets whose peer address (getpeername for
	// TCP and connected UDP, the reply's source for unconnected UDP) was
	// not the address the client asked for.
	PeerMismatch int            `json:"peer_mismatch"`
	LastPeer     string         `json:"last_peer"`
	Errors       map[string]int `json:"errors"`
	FirstError   string         `json:"first_error,omitempty"`
}

// Probe connects (or sends) count times to target over mode "tcp",
// "udp" (connected) or "udp-unconnected", reading each reply.
func Probe(ctx context.Context, mode, target string, count int) (*LBProbe, error) {
	want, err := netip.ParseAddrPort(target)
	if err != nil {
		return nil, err
	}
	res := &LBProbe{Replies: map[string]int{}, Errors: map[string]int{}}
	fail := func(err error) {
		res.Errors[errnoName(err)]++
		if res.FirstError == "" {
			res.FirstError = err.Error()
		}
	}
	buf := make([]byte, 2048)
	var uc *net.UDPConn
	if mode == "udp-unconnected" {
		if uc, err = net.ListenUDP("udp", nil); err != nil {
			return nil, err
		}
		defer uc.Close()
	}
	for i := 0; i < count && ctx.Err() == nil; i++ {
		switch mode {
		case "tcp", "udp":
			d := net.Dialer{Timeout: 5 * time.Second}
			c, err := d.DialContext(ctx, mode, target)
			if err != nil {
				fail(err)
				continue
			}
			peer, err := getpeername(c.(syscall.Conn))
			if err != nil {
				fail(err)
			}
			res.LastPeer = peer.String()
			if peer != want {
				res.PeerMismatch++
			}
			if mode == "udp" {
				_, _ = c.Write([]byte("who"))
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := c.Read(buf)
			c.Close()
			if err != nil {
				fail(err)
				continue
			}
			res.Replies[string(buf[:n])]++
		case "udp-unconnected":
			if _, err := uc.WriteToUDPAddrPort([]byte("who"), want); err != nil {
				fail(err)
				continue
			}
			_ = uc.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, from, err := uc.ReadFromUDPAddrPort(buf)
			if err != nil {
				fail(err)
				continue
			}
			res.LastPeer = from.String()
			if netip.AddrPortFrom(from.Addr().Unmap(), from.Port()) != want {
				res.PeerMismatch++
			}
			res.Replies[string(buf[:n])]++
		default:
			return nil, fmt.Errorf("mode %q: want tcp, udp or udp-unconnected", mode)
		}
	}
	return res, nil
}

func getpeername(c syscall.Conn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var sa unix.Sockaddr
	var gerr error
	if err := rc.Control(func(fd uintptr) { sa, gerr = unix.Getpeername(int(fd)) }); err != nil {
		return netip.AddrPort{}, err
	}
	if gerr != nil {
		return netip.AddrPort{}, gerr
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)), nil
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port)), nil
	}
	return netip.AddrPort{}, fmt.Errorf("peer address of type %T", sa)
}

// Request sends data on one connection to addr and returns the first
// reply (whatever one read returns), then closes.
func Request(ctx context.Context, addr, data string) (string, error) {
	c, err := DialAddr(ctx, addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := c.Write([]byte(data)); err != nil {
		return "", fmt.Errorf("writing: %w", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		return "", fmt.Errorf("reading: %w", err)
	}
	return string(buf[:n]), nil
}
