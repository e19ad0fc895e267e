// Package top computes and renders `socklane top`: the busiest bypassed
// connections and services, as rates between two samples of the
// datapath.
package top

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/socklane/socklane/internal/datapath"
)

// Sample is one reading of the datapath.
type Sample struct {
	At       time.Time
	Conns    []datapath.Conn
	Services *datapath.LBStats
	Counters datapath.Counts[datapath.Counter]
	Sockets  int
	// Names maps frontends (service.Frontend.String()) to service names.
	Names map[string]string
}

// ConnRate is one connection's traffic between two samples.
type ConnRate struct {
	Client, Server netip.AddrPort
	Path           string  // bypass, tcp, or mixed when the directions differ
	Up, Down       float64 // bytes per second, client to server and back
	Total          uint64  // bytes so far, both directions
	Age            time.Duration
}

// ServiceRate is one service's connections between two samples.
type ServiceRate struct {
	Service  string
	Selected float64 // backends chosen per second
	Refused  float64 // connects refused per second (no backend)
	Backends int     // backends chosen in the interval
}

// Frame is what one refresh shows.
type Frame struct {
	At                time.Time
	Interval          time.Duration
	Sockets           int
	BypassBytes       float64 // per second, all connections
	TCPBytes          float64
	Bypassed, Decided float64 // connections per second
	Conns             []ConnRate
	Services          []ServiceRate
}

type connKey struct {
	slot           uint32
	client, server netip.AddrPort
}

func bytesOf(d datapath.Direction) uint64 { return d.Bytes + d.TCPBytes }

// Compute turns two samples into a frame with the n busiest connections
// and services (n <= 0: all).
func Compute(prev, cur Sample, n int) Frame {
	f := Frame{At: cur.At, Interval: cur.At.Sub(prev.At), Sockets: cur.Sockets}
	secs := f.Interval.Seconds()
	if secs <= 0 {
		secs = 1
	}
	rate := func(a, b uint64) float64 {
		if b < a {
			return 0 // a slot reused by a new connection
		}
		return float64(b-a) / secs
	}
	counter := func(k datapath.Counter) float64 { return rate(prev.Counters.Get(k), cur.Counters.Get(k)) }
	f.BypassBytes = counter(datapath.CounterRedirectBytes)
	f.TCPBytes = counter(datapath.CounterPassBytes)
	f.Bypassed = counter(datapath.CounterConnsBypassed)
	f.Decided = f.Bypassed + counter(datapath.CounterConnsTCP)

	before := map[connKey]datapath.Conn{}
	for _, c := range prev.Conns {
		before[connKey{c.Slot, c.Client, c.Server}] = c
	}
	for _, c := range cur.Conns {
		p := before[connKey{c.Slot, c.Client, c.Server}] // zero if new: all its bytes are recent
		path := c.ClientToServer.Path
		if c.ServerToClient.Path != path {
			path = "mixed"
		}
		f.Conns = append(f.Conns, ConnRate{
			Client: c.Client, Server: c.Server, Path: path, Age: c.Age,
			Up:    rate(bytesOf(p.ClientToServer), bytesOf(c.ClientToServer)),
			Down:  rate(bytesOf(p.ServerToClient), bytesOf(c.ServerToClient)),
			Total: bytesOf(c.ClientToServer) + bytesOf(c.ServerToClient),
		})
	}
	slices.SortStableFunc(f.Conns, func(a, b ConnRate) int {
		if c := cmp.Compare(b.Up+b.Down, a.Up+a.Down); c != 0 {
			return c
		}
		return cmp.Compare(b.Total, a.Total)
	})
	if n > 0 && len(f.Conns) > n {
		f.Conns = f.Conns[:n]
	}

	if prev.Services != nil && cur.Services != nil {
		type key struct{ fe, be string }
		sel := map[key]uint64{}
		for _, s := range prev.Services.Selections {
			sel[key{s.Frontend.String(), s.Backend.String()}] = s.Count
		}
		svcs := map[string]*ServiceRate{}
		get := func(fe string) *ServiceRate {
			name := cur.Names[fe]
			if name == "" {
				name = fe
			}
			if svcs[name] == nil {
				svcs[name] = &ServiceRate{Service: name}
			}
			return svcs[name]
		}
		for _, s := range cur.Services.Selections {
			r := rate(sel[key{s.Frontend.String(), s.Backend.String()}], s.Count)
			sr := get(s.Frontend.String())
			sr.Selected += r
			if r > 0 {
				sr.Backends++
			}
		}
		for fe, n := range cur.Services.Refused {
			get(fe).Refused += rate(prev.Services.Refused[fe], n)
		}
		for _, s := range svcs {
			f.Services = append(f.Services, *s)
		}
		slices.SortStableFunc(f.Services, func(a, b ServiceRate) int {
			if c := cmp.Compare(b.Selected+b.Refused, a.Selected+a.Refused); c != 0 {
				return c
			}
			return strings.Compare(a.Service, b.Service)
		})
		if n > 0 && len(f.Services) > n {
			f.Services = f.Services[:n]
		}
	}
	return f
}

// human formats a rate of bytes per second.
func human(bps float64) string {
	units := []string{"B/s", "KB/s", "MB/s", "GB/s"}
	i := 0
	for bps >= 1000 && i < len(units)-1 {
		bps /= 1000
		i++
	}
	return fmt.Sprintf("%.1f %s", bps, units[i])
}

// Render lays a frame out as text.
func Render(f Frame) string {
	var b strings.Builder
	fmt.Fprintf(&b, "socklane top  %s  every %s\n", f.At.Format(time.TimeOnly), f.Interval.Round(time.Millisecond))
	fmt.Fprintf(&b, "bypassed sockets %d   bypass %s   tcp %s   connections %.1f/s (%.1f/s bypassed)\n\n",
		f.Sockets, human(f.BypassBytes), human(f.TCPBytes), f.Decided, f.Bypassed)
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CLIENT\tSERVER\tPATH\tC->S\tS->C\tTOTAL B\tAGE")
	for _, c := range f.Conns {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", c.Client, c.Server, c.Path, human(c.Up), human(c.Down), c.Total, c.Age.Round(time.Second))
	}
	if len(f.Conns) == 0 {
		fmt.Fprintln(w, "(no managed connection)")
	}
	_ = w.Flush()
	if len(f.Services) > 0 {
		b.WriteString("\n")
		w = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "SERVICE\tCONNECTS/S\tBACKENDS\tREFUSED/S")
		for _, s := range f.Services {
			fmt.Fprintf(w, "%s\t%.1f\t%d\t%.1f\n", s.Service, s.Selected, s.Backends, s.Refused)
		}
		_ = w.Flush()
	}
	return b.String()
}
