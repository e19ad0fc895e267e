package peer

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

// UDPFlood sends count one-byte datagrams round the (address, port) pairs
// from sockets unconnected UDP sockets (a datagram each in turn) and
// returns how many were sent. The sockets stay open until release is
// called (nil on error).
func UDPFlood(ctx context.Context, addrs []netip.Addr, ports []uint16, count, sockets int) (sent int, release func(), err error) {
	if len(addrs) == 0 || len(ports) == 0 {
		return 0, nil, fmt.Errorf("udpflood: want addresses and ports")
	}
	if sockets < 1 {
		return 0, nil, fmt.Errorf("udpflood: want at least one socket")
	}
	pcs := make([]*net.UDPConn, 0, sockets)
	release = func() {
		for _, pc := range pcs {
			pc.Close()
		}
	}
	for range sockets {
		pc, err := net.ListenUDP("udp", nil)
		if err != nil {
			release()
			return 0, nil, fmt.Errorf("opening socket %d: %w", len(pcs), err)
		}
		pcs = append(pcs, pc)
	}
	for i := 0; i < count && ctx.Err() == nil; i++ {
		a := addrs[(i/len(ports))%len(addrs)]
		to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, ports[i%len(ports)]))
		if _, err := pcs[i%len(pcs)].WriteToUDP([]byte{0}, to); err == nil {
			sent++
		}
	}
	return sent, release, nil
}

// SYNFlood sends count SYNs round the ports of ip from sockets that never
// complete a handshake: each is a non-blocking connect(), which sends its
// SYN before it returns, closed at once. Where the SYN-ACKs are dropped (a
// netfilter rule of the caller's network namespace; on loopback the
// handshake would otherwise complete within connect()), each SYN leaves
// its listener a request until the SYN-ACK's retries run out: a SYN flood.
// Returns how many SYNs were sent.
func SYNFlood(ctx context.Context, ip netip.Addr, ports []uint16, count int) (int, error) {
	if len(ports) == 0 || count < 1 {
		return 0, fmt.Errorf("synflood: want at least one port and one SYN")
	}
	family := unix.AF_INET
	if ip.Is6() && !ip.Is4In6() {
		family = unix.AF_INET6
	}
	sent := 0
	for i := 0; i < count && ctx.Err() == nil; i++ {
		fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return sent, fmt.Errorf("opening socket %d: %w", i, err)
		}
		port := int(ports[i%len(ports)])
		var sa unix.Sockaddr = &unix.SockaddrInet4{Port: port, Addr: ip.Unmap().As4()}
		if family == unix.AF_INET6 {
			sa = &unix.SockaddrInet6{Port: port, Addr: ip.As16()}
		}
		err = unix.Connect(fd, sa)
		unix.Close(fd)
		if err != nil && err != unix.EINPROGRESS {
			return sent, fmt.Errorf("connecting socket %d to port %d: %w", i, port, err)
		}
		sent++
	}
	return sent, nil
}
