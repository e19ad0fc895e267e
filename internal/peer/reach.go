package peer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"
)

// Reach is what one probe of a target saw: "ok" (with the server's
// label), or the errno of a refusal ("EPERM": network policy at
// connect/send), or "timeout" (dropped on the way).
type Reach struct {
	Target string `json:"target"`
	Result string `json:"result"`
	Label  string `json:"label,omitempty"`
}

// Reachability probes every target (ADDR:PORT/tcp, /udp for connected
// UDP, /udpu for unconnected sends) at once, each within timeout, against
// whoami servers; from bind, if valid.
func Reachability(ctx context.Context, targets []string, timeout time.Duration, bind netip.Addr) ([]Reach, error) {
	out := make([]Reach, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		addr, mode, ok := strings.Cut(t, "/")
		ap, err := netip.ParseAddrPort(addr)
		if !ok || err != nil {
			return nil, fmt.Errorf("target %q: want ADDR:PORT/tcp|udp|udpu", t)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = Reach{Target: t}
			out[i].Label, err = reachOne(ctx, ap, mode, timeout, bind)
			out[i].Result = reachResult(err)
		}()
	}
	wg.Wait()
	return out, nil
}

func reachResult(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	return errnoName(err)
}

func reachOne(ctx context.Context, ap netip.AddrPort, mode string, timeout time.Duration, bind netip.Addr) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	buf := make([]byte, 256)
	switch mode {
	case "tcp", "udp":
		var d net.Dialer
		if bind.IsValid() {
			if mode == "tcp" {
				d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(bind, 0))
			} else {
				d.LocalAddr = net.UDPAddrFromAddrPort(netip.AddrPortFrom(bind, 0))
			}
		}
		c, err := d.DialContext(ctx, mode, ap.String())
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetDeadline(deadline)
		if mode == "udp" {
			if _, err := c.Write([]byte("who")); err != nil {
				return "", err
			}
		}
		n, err := c.Read(buf)
		return string(buf[:n]), err
	case "udpu":
		network := "udp4"
		if ap.Addr().Is6() {
			network = "udp6"
		}
		local := ""
		if bind.IsValid() {
			local = netip.AddrPortFrom(bind, 0).String()
		}
		pc, err := net.ListenPacket(network, local)
		if err != nil {
			return "", err
		}
		defer pc.Close()
		_ = pc.SetDeadline(deadline)
		if _, err := pc.WriteTo([]byte("who"), net.UDPAddrFromAddrPort(ap)); err != nil {
			return "", err
		}
		n, _, err := pc.ReadFrom(buf)
		return string(buf[:n]), err
	}
	return "", fmt.Errorf("mode %q: want tcp, udp or udpu", mode)
}
