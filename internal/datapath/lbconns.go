package datapath

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/service"
)

// TrackedSocket is a connected socket that the load balancer sent to a
// backend.
type TrackedSocket struct {
	Cookie   uint64 // socket cookie
	Netns    uint64 // network namespace cookie
	Protocol service.Protocol
	Backend  netip.AddrPort
}

// eachTracked calls fn for every entry of the translated-socket table.
func (d *Datapath) eachTracked(fn func(cookie uint64, c servicelbSlLbConn)) error {
	return eachEntry(d.lb.SlLbConns, "translated sockets", fn)
}

func trackedSocket(cookie uint64, c servicelbSlLbConn) TrackedSocket {
	return TrackedSocket{
		Cookie:   cookie,
		Netns:    c.Netns,
		Protocol: service.ProtocolOf(c.Proto),
		Backend:  netip.AddrPortFrom(wordsAddr(c.Member.Be.Ip), c.Member.Be.Port),
	}
}

// StaleSockets lists the connected sockets whose (frontend, backend) pair
// the apply that returned st removed. Run it after the apply: a connect
// that starts afterwards no longer picks a removed backend.
func (d *Datapath) StaleSockets(st ApplyStats) ([]TrackedSocket, error) {
	if len(st.removed) == 0 {
		return nil, nil
	}
	gone := make(map[servicelbSlMemberKey]bool, len(st.removed))
	for _, k := range st.removed {
		gone[k] = true
	}
	var out []TrackedSocket
	err := d.eachTracked(func(cookie uint64, c servicelbSlLbConn) {
		if gone[c.Member] {
			out = append(out, trackedSocket(cookie, c))
		}
	})
	return out, err
}

// Tracked lists every connected socket the load balancer remembers a
// backend for.
func (d *Datapath) Tracked() ([]TrackedSocket, error) {
	var out []TrackedSocket
	err := d.eachTracked(func(cookie uint64, c servicelbSlLbConn) {
		out = append(out, trackedSocket(cookie, c))
	})
	return out, err
}

// TrackedSockets is the number of connected sockets the load balancer
// currently remembers a backend for.
func (d *Datapath) TrackedSockets() (int, error) {
	n := 0
	err := d.eachTracked(func(uint64, servicelbSlLbConn) { n++ })
	return n, err
}

// ForgetTracked removes the entries of sockets that closed without the
// load balancer seeing them go (their cgroup was detached meanwhile), and
// returns how many it removed. Entries already gone are skipped.
func (d *Datapath) ForgetTracked(cookies []uint64) (int, error) {
	// Through sl_lb_forget, which also returns the entry's charge to its
	// owner's quota.
	n := 0
	for _, c := range cookies {
		ret, err := d.lb.SlLbForget.Run(&ebpf.RunOptions{Context: servicelbSlLbForgetArgs{Cookie: c}})
		if err != nil {
			return n, fmt.Errorf("forgetting translated socket %d: %w", c, err)
		}
		n += int(ret)
	}
	return n, nil
}
