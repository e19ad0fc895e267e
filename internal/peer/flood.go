package peer

import (
	"context"
	"fmt"
	"net"
	"net/netip"
)

// UDPFlood sends count one-byte datagrams from one unconnected UDP socket,
// each to another (address, port) of addrs and ports in turn: a pod
// making as many UDP exchanges as it can. It returns how many it sent.
func UDPFlood(ctx context.Context, addrs []netip.Addr, ports []uint16, count int) (int, error) {
	if len(addrs) == 0 || len(ports) == 0 {
		return 0, fmt.Errorf("udpflood: want addresses and ports")
	}
	pc, err := net.ListenUDP("udp", nil)
	if err != nil {
		return 0, err
	}
	defer pc.Close()
	sent := 0
	for i := 0; i < count && ctx.Err() == nil; i++ {
		a := addrs[(i/len(ports))%len(addrs)]
		to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, ports[i%len(ports)]))
		if _, err := pc.WriteToUDP([]byte{0}, to); err == nil {
			sent++
		}
	}
	return sent, nil
}
