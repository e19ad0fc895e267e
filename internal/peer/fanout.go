package peer

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"
)

// fanoutTag starts a fanout request; whoami answers it with its label, a
// space and the request.
const fanoutTag = "fanout:"

// FanoutReport is what one unconnected UDP socket saw talking to several
// service addresses.
type FanoutReport struct {
	Sent    int `json:"sent"`
	Replies int `json:"replies"`
	// WrongSource counts replies whose source was not the address their
	// request went to (the socket could not tell them apart, or the
	// translation was lost).
	WrongSource int      `json:"wrong_source"`
	Examples    []string `json:"examples,omitempty"`
}

// Fanout sends from one unconnected UDP socket to every target, rounds
// times: in bursts (to every target, then every reply is read) or one
// request and its reply at a time. Each request names its target; each
// reply's source must be that target.
func Fanout(ctx context.Context, targets []netip.AddrPort, rounds int, burst bool) (*FanoutReport, error) {
	uc, err := net.ListenUDP("udp", nil)
	if err != nil {
		return nil, err
	}
	defer uc.Close()
	rep := &FanoutReport{}
	buf := make([]byte, 2048)
	read := func() error {
		_ = uc.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := uc.ReadFromUDPAddrPort(buf)
		if err != nil {
			return fmt.Errorf("reply %d: %w", rep.Replies+1, err)
		}
		rep.Replies++
		_, req, _ := strings.Cut(string(buf[:n]), " ")
		asked := strings.TrimPrefix(req, fanoutTag)
		if got := netip.AddrPortFrom(from.Addr().Unmap(), from.Port()).String(); got != asked {
			rep.WrongSource++
			if len(rep.Examples) < 3 {
				rep.Examples = append(rep.Examples, fmt.Sprintf("reply to %s came from %s", asked, got))
			}
		}
		return nil
	}
	send := func(t netip.AddrPort) error {
		if _, err := uc.WriteToUDPAddrPort([]byte(fanoutTag+t.String()), t); err != nil {
			return fmt.Errorf("sending to %s: %w", t, err)
		}
		rep.Sent++
		return nil
	}
	for range rounds {
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		for _, t := range targets {
			if err := send(t); err != nil {
				return rep, err
			}
			if !burst {
				if err := read(); err != nil {
					return rep, err
				}
			}
		}
		for range targets {
			if !burst {
				break
			}
			if err := read(); err != nil {
				return rep, err
			}
		}
	}
	return rep, nil
}
