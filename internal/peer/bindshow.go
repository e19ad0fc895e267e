package peer

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Bound is one socket BindShow bound (or failed to).
type Bound struct {
	Spec     string `json:"spec"`
	Sockname string `json:"sockname,omitempty"` // as getsockname answers
	Error    string `json:"error,omitempty"`    // errno name of a failed bind
}

// BindShow binds every spec ("tcp4:ADDR:PORT", "tcp6:[ADDR]:PORT",
// "udp4:...", "udp6:..."; IPv6 sockets are IPv6-only), writes one JSON
// line with what each bind and getsockname gave, then serves each bound
// socket until ctx ends: a TCP connection gets label and the port its
// accepted socket's getsockname shows ("a 3000"); a UDP datagram, label.
func BindShow(ctx context.Context, out io.Writer, specs []string, label string, reuseport bool) error {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if reuseport {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
	var res []Bound
	var serve []func()
	for _, s := range specs {
		network, addr, ok := strings.Cut(s, ":")
		if !ok {
			return fmt.Errorf("spec %q: want NETWORK:ADDR:PORT", s)
		}
		b := Bound{Spec: s}
		switch network {
		case "tcp4", "tcp6":
			ln, err := lc.Listen(ctx, network, addr)
			if err != nil {
				b.Error = errnoName(err)
				break
			}
			b.Sockname = ln.Addr().String()
			serve = append(serve, func() {
				_ = serveEach(ctx, ln, func(c net.Conn) {
					local := c.LocalAddr().(*net.TCPAddr).Port
					if _, err := fmt.Fprintf(c, "%s %d", label, local); err == nil {
						_, _ = io.Copy(io.Discard, c)
					}
				})
			})
		case "udp4", "udp6":
			pc, err := lc.ListenPacket(ctx, network, addr)
			if err != nil {
				b.Error = errnoName(err)
				break
			}
			b.Sockname = pc.LocalAddr().String()
			serve = append(serve, func() {
				go func() { <-ctx.Done(); pc.Close() }()
				buf := make([]byte, 2048)
				for {
					_, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					_, _ = pc.WriteTo([]byte(label), from)
				}
			})
		default:
			return fmt.Errorf("spec %q: network %q: want tcp4, tcp6, udp4 or udp6", s, network)
		}
		res = append(res, b)
	}
	if err := json.NewEncoder(out).Encode(res); err != nil {
		return err
	}
	for _, f := range serve {
		go f()
	}
	<-ctx.Done()
	return nil
}

// BindLoop times count rounds of socket, bind to addr (IPv4) and close,
// as a program that binds a port does (no listen: the port is given back
// at close).
func BindLoop(ctx context.Context, addr string, count int) (Latency, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		return Latency{}, fmt.Errorf("bindloop %q: want an IPv4 ADDR:PORT", addr)
	}
	sa := &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	rtts := make([]time.Duration, 0, count)
	for i := 0; i < count && ctx.Err() == nil; i++ {
		start := time.Now()
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return Latency{}, fmt.Errorf("socket: %w", err)
		}
		err = unix.Bind(fd, sa)
		unix.Close(fd)
		if err != nil {
			return Latency{}, fmt.Errorf("bind %s: %w", addr, err)
		}
		rtts = append(rtts, time.Since(start))
	}
	return Summarize(0, rtts), nil
}
