package peer

import (
	"context"
	"fmt"
	"net"
	"net/netip"
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
