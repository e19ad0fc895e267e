package datapath

import (
	"fmt"
	"net/netip"

	"github.com/socklane/socklane/internal/service"
)

// StaleSocket is a connected socket that the load balancer sent to a
// backend that has since been removed from its frontend.
type StaleSocket struct {
	Cookie   uint64 // socket cookie
	Netns    uint64 // network namespace cookie
	Protocol service.Protocol
	Backend  netip.AddrPort
}

// StaleSockets lists the connected sockets whose (frontend, backend) pair
// the apply that returned st removed. Run it after the apply: a connect
// that starts afterwards no longer picks a removed backend.
func (d *Datapath) StaleSockets(st ApplyStats) ([]StaleSocket, error) {
	if len(st.removed) == 0 {
		return nil, nil
	}
	gone := make(map[servicelbSlMemberKey]bool, len(st.removed))
	for _, k := range st.removed {
		gone[k] = true
	}
	var out []StaleSocket
	var cookie uint64
	var c servicelbSlLbConn
	it := d.lb.SlLbConns.Iterate()
	for it.Next(&cookie, &c) {
		if !gone[c.Member] {
			continue
		}
		proto := service.TCP
		if c.Proto == ipprotoUDP {
			proto = service.UDP
		}
		out = append(out, StaleSocket{
			Cookie:   cookie,
			Netns:    c.Netns,
			Protocol: proto,
			Backend:  netip.AddrPortFrom(wordsAddr(c.Member.Be.Ip), c.Member.Be.Port),
		})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading translated sockets: %w", err)
	}
	return out, nil
}

// TrackedSockets is the number of connected sockets the load balancer
// currently remembers a backend for.
func (d *Datapath) TrackedSockets() (int, error) {
	n := 0
	var cookie uint64
	var c servicelbSlLbConn
	it := d.lb.SlLbConns.Iterate()
	for it.Next(&cookie, &c) {
		n++
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("reading translated sockets: %w", err)
	}
	return n, nil
}
