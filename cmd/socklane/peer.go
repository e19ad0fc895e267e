package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/socklane/socklane/internal/peer"
	"github.com/spf13/cobra"
)

// newPeerCmd is the traffic program run inside pods by the tests, the demo
// and the benchmarks.
func newPeerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:    "peer",
		Short:  "Traffic program for tests and benchmarks (integrity streams, echo, ping-pong)",
		Hidden: true,
	}
	var cfg peer.IntegrityConfig
	var conns int
	addCfg := func(c *cobra.Command) {
		c.Flags().Int64Var(&cfg.Bytes, "bytes", 1<<20, "average bytes each side sends per connection")
		c.Flags().Int64Var(&cfg.SlowBytes, "slow-bytes", 16<<20, "bytes the client floods in slow-receiver mode")
		c.Flags().IntVar(&cfg.MaxMsg, "max-msg", 256<<10, "largest write; sizes are uniform in [1, max]")
		c.Flags().Uint64Var(&cfg.Seed, "seed", 1, "random seed")
		c.Flags().IntVar(&conns, "conns", 64, "connections")
		c.Flags().StringVar(&cfg.IO, "io", "mixed", "socket I/O: epoll, blocking, or mixed (alternating)")
		c.Flags().BoolVar(&cfg.TrustFIONREAD, "check-fionread", true, "in peek mode, fail a stream whose FIONREAD counts less than MSG_PEEK returned (false on a kernel known to answer 0 for redirected bytes)")
	}
	server := &cobra.Command{
		Use:  "integrity-server ADDR",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			ln, err := peer.Listen(args[0], cfg.IO != "blocking")
			if err != nil {
				return err
			}
			fmt.Fprintln(os.Stderr, "listening", args[0])
			sum := peer.Serve(ctx, ln, cfg, conns, os.Stdout)
			if sum.Failed > 0 {
				return fmt.Errorf("%d of %d connections failed verification", sum.Failed, sum.Conns)
			}
			return nil
		},
	}
	client := &cobra.Command{
		Use:  "integrity-client ADDR:PORT",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			target, err := netip.ParseAddrPort(args[0])
			if err != nil {
				return err
			}
			sum := peer.Dial(ctx, target, cfg, conns, os.Stdout)
			if sum.Failed > 0 {
				return fmt.Errorf("%d of %d connections failed verification", sum.Failed, sum.Conns)
			}
			return nil
		},
	}
	addCfg(server)
	addCfg(client)
	var ioMode string
	const ioUsage = "socket I/O: blocking (one system call per operation) or netpoll (Go's net package, epoll)"
	listenCmd := func(use string, serve func(context.Context, string, peer.IO, func(string)) error) *cobra.Command {
		c := &cobra.Command{
			Use:  use + " ADDR",
			Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				mode, err := peer.ParseIO(ioMode)
				if err != nil {
					return err
				}
				ctx := cmd.Context()
				return serve(ctx, args[0], mode, func(addr string) { fmt.Fprintln(os.Stderr, "listening", addr) })
			},
		}
		c.Flags().StringVar(&ioMode, "io", string(peer.IONetpoll), ioUsage)
		return c
	}
	var fastOpen int
	echo := listenCmd("echo", func(ctx context.Context, addr string, mode peer.IO, ready func(string)) error {
		if fastOpen > 0 {
			return peer.EchoFastOpen(ctx, addr, fastOpen, ready)
		}
		return peer.Echo(ctx, addr, mode, ready)
	})
	echo.Flags().IntVar(&fastOpen, "fastopen", 0, "accept TCP Fast Open data in SYNs (queue length; netpoll only)")
	var sinkOpts peer.SinkOptions
	sink := listenCmd("sink", func(ctx context.Context, addr string, mode peer.IO, ready func(string)) error {
		return peer.SinkWith(ctx, addr, mode, ready, sinkOpts)
	})
	sink.Flags().DurationVar(&sinkOpts.Delay, "delay", 0, "start reading each connection this long after accepting it")
	sink.Flags().BoolVar(&sinkOpts.ByFIONREAD, "fionread", false, "read as many bytes as FIONREAD says, as nginx and Java's available() do (no answer if FIONREAD says 0 for 2 s with bytes queued)")
	var proxyTo string
	proxy := &cobra.Command{
		Use:   "proxy ADDR",
		Short: "Relay each connection to --to with io.Copy both ways (splice(2), as Go's TCP proxies do)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if proxyTo == "" {
				return fmt.Errorf("peer proxy needs --to HOST:PORT")
			}
			return peer.Proxy(cmd.Context(), args[0], proxyTo, func(addr string) { fmt.Fprintln(os.Stderr, "listening", addr) })
		},
	}
	proxy.Flags().StringVar(&proxyTo, "to", "", "where to relay each connection (HOST:PORT)")
	var size, count, warmup int
	var duration time.Duration
	clientCmd := func(use string, run func(ctx context.Context, addr string) (any, error)) *cobra.Command {
		c := &cobra.Command{
			Use:  use + " ADDR",
			Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				ctx := cmd.Context()
				res, err := run(ctx, args[0])
				if err != nil {
					return err
				}
				return json.NewEncoder(os.Stdout).Encode(res)
			},
		}
		c.Flags().IntVar(&size, "size", 64, "message size")
		c.Flags().IntVar(&count, "count", 10000, "round trips, connections or messages (stream: 0 runs for --duration)")
		return c
	}
	// benchCmd is a benchmark client: its sockets are driven as --io says.
	benchCmd := func(use string, run func(ctx context.Context, addr string, mode peer.IO) (any, error)) *cobra.Command {
		c := clientCmd(use, func(ctx context.Context, addr string) (any, error) {
			mode, err := peer.ParseIO(ioMode)
			if err != nil {
				return nil, err
			}
			return run(ctx, addr, mode)
		})
		c.Flags().StringVar(&ioMode, "io", string(peer.IONetpoll), ioUsage)
		return c
	}
	pingpong := benchCmd("pingpong", func(ctx context.Context, addr string, mode peer.IO) (any, error) {
		return peer.PingPong(ctx, addr, mode, size, count, warmup)
	})
	pingpong.Flags().IntVar(&warmup, "warmup", 100, "round trips before measuring")
	httpServer := listenCmd("http-server", func(ctx context.Context, addr string, _ peer.IO, ready func(string)) error {
		return peer.HTTPServe(ctx, addr, ready)
	})
	httpServer.Short = "Go net/http server: GET /N answers N bytes"
	httpGets := clientCmd("http-gets", func(ctx context.Context, url string) (any, error) {
		return peer.HTTPGets(ctx, url, size, count, warmup)
	})
	httpGets.Short = "Go net/http client: --count GETs of --size bytes over one kept-alive connection, timed"
	httpGets.Flags().IntVar(&warmup, "warmup", 100, "requests before measuring")
	var streamOpts peer.StreamOpts
	stream := benchCmd("stream", func(ctx context.Context, addr string, mode peer.IO) (any, error) {
		return peer.StreamPaced(ctx, addr, mode, size, duration, count, streamOpts)
	})
	stream.Flags().DurationVar(&duration, "duration", time.Second, "how long to send when --count is 0")
	stream.Flags().DurationVar(&streamOpts.Interval, "interval", 0, "pause after each write")
	stream.Flags().IntVar(&streamOpts.Large, "large", 0, "after the first write, one of this many bytes (its verdict window may cover the next writes)")
	stream.Flags().IntVar(&streamOpts.TailSize, "tail-size", 16, "bytes per write of the tail (--tail-count)")
	stream.Flags().IntVar(&streamOpts.TailCount, "tail-count", 0, "writes of --tail-size bytes after the stream's")
	stream.Flags().DurationVar(&streamOpts.TailPause, "tail-pause", 0, "pause before the tail")
	stream.Flags().BoolVar(&streamOpts.Window, "window", false, "report the window the sink's TCP last offered (TCP_INFO snd_wnd) after the stream's writes (snd_wnd) and after the tail's (tail_snd_wnd)")
	stream.Flags().IntVar(&streamOpts.NoDelay, "nodelay", 0, "TCP_NODELAY on the writer's socket: 1 on, -1 off (Nagle), 0 the default (on with netpoll, as Go sets it; off with blocking sockets)")
	connects := benchCmd("connects", func(ctx context.Context, addr string, mode peer.IO) (any, error) {
		return peer.Connects(ctx, addr, mode, size, count)
	})
	var network, label, mode string
	var whoamiPorts string
	var whoamiDelay time.Duration
	whoami := &cobra.Command{
		Use:  "whoami ADDR",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if whoamiPorts == "" {
				return peer.WhoamiAfter(ctx, network, args[0], label, whoamiDelay)
			}
			ps, err := peer.ParsePorts(whoamiPorts)
			if err != nil {
				return err
			}
			errs := make(chan error, len(ps))
			for _, p := range ps {
				go func() {
					errs <- peer.WhoamiAfter(ctx, network, net.JoinHostPort(args[0], strconv.Itoa(int(p))), label, whoamiDelay)
				}()
			}
			return <-errs
		},
	}
	whoami.Flags().StringVar(&network, "network", "tcp", "tcp or udp")
	whoami.Flags().StringVar(&label, "label", "", "what to answer")
	whoami.Flags().StringVar(&whoamiPorts, "ports", "", "serve on each of these ports (A-B); ADDR is then a host alone")
	whoami.Flags().DurationVar(&whoamiDelay, "delay", 0, "answer each UDP datagram this long after it came")
	var fanoutRounds int
	var fanoutBurst bool
	fanout := &cobra.Command{
		Use:   "fanout TARGET...",
		Short: "From one unconnected UDP socket, ask every target (whoami servers or VIPs) and check each reply's source",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var targets []netip.AddrPort
			for _, a := range args {
				t, err := netip.ParseAddrPort(a)
				if err != nil {
					return fmt.Errorf("target %q: %w", a, err)
				}
				targets = append(targets, t)
			}
			ctx := cmd.Context()
			rep, err := peer.Fanout(ctx, targets, fanoutRounds, fanoutBurst)
			if err != nil {
				return err
			}
			return json.NewEncoder(os.Stdout).Encode(rep)
		},
	}
	fanout.Flags().IntVar(&fanoutRounds, "rounds", 10, "requests to each target")
	fanout.Flags().BoolVar(&fanoutBurst, "burst", false, "send to every target before reading the replies")
	probe := clientCmd("lbprobe", func(ctx context.Context, addr string) (any, error) {
		return peer.Probe(ctx, mode, addr, count)
	})
	probe.Flags().StringVar(&mode, "mode", "tcp", "tcp, udp (connected) or udp-unconnected")
	var bindLabel string
	var bindReuseport bool
	var bindFor time.Duration
	bindshow := &cobra.Command{
		Use:   "bindshow SPEC...",
		Short: "Bind tcp4:ADDR:PORT, tcp6:[ADDR]:PORT, udp4:..., udp6:... (IPv6-only), print what bind and getsockname gave as JSON, then answer each",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if bindFor > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, bindFor)
				defer cancel()
			}
			return peer.BindShow(ctx, os.Stdout, args, bindLabel, bindReuseport)
		},
	}
	bindshow.Flags().DurationVar(&bindFor, "for", 0, "serve this long, then exit (0: until interrupted)")
	bindshow.Flags().StringVar(&bindLabel, "label", "", "what to answer")
	bindshow.Flags().BoolVar(&bindReuseport, "reuseport", false, "set SO_REUSEPORT before binding")
	var bindCount int
	bindloop := &cobra.Command{
		Use:   "bindloop ADDR:PORT",
		Short: "Time rounds of socket, bind and close (IPv4); print the latency summary as JSON",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := peer.BindLoop(cmd.Context(), args[0], bindCount)
			if err != nil {
				return err
			}
			return json.NewEncoder(os.Stdout).Encode(l)
		},
	}
	bindloop.Flags().IntVar(&bindCount, "count", 10000, "rounds")
	var holdMode, holdName string
	var holdConns int
	var holdFor time.Duration
	hold := &cobra.Command{
		Use:  "hold ADDR:PORT",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			ctx, cancel := context.WithTimeout(ctx, holdFor)
			defer cancel()
			return peer.Hold(ctx, os.Stdout, holdMode, args[0], holdName, holdConns)
		},
	}
	hold.Flags().StringVar(&holdMode, "mode", "tcp", "tcp, udp (connected; whoami servers) or dns (connected UDP, A query)")
	hold.Flags().StringVar(&holdName, "name", "", "name to resolve in dns mode")
	hold.Flags().IntVar(&holdConns, "conns", 8, "sockets to hold open")
	hold.Flags().DurationVar(&holdFor, "for", 30*time.Second, "give up after this long")
	var data string
	request := clientCmd("request", func(ctx context.Context, addr string) (any, error) {
		reply, err := peer.Request(ctx, addr, data)
		return map[string]string{"reply": reply}, err
	})
	request.Flags().StringVar(&data, "data", "hello", "what to send")
	pause := &cobra.Command{
		Use:   "pause",
		Short: "Sleep until SIGTERM or SIGINT (a pod sandbox's process in the tests' images)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			<-ctx.Done()
			return nil
		},
	}
	var reachTimeout time.Duration
	var reachBind string
	reach := &cobra.Command{
		Use:   "reach TARGET/PROTO...",
		Short: "Probe whoami servers at once (ADDR:PORT/tcp, /udp connected, /udpu unconnected) and print what each probe saw",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var bind netip.Addr
			if reachBind != "" {
				var err error
				if bind, err = netip.ParseAddr(reachBind); err != nil {
					return fmt.Errorf("--bind %q: %w", reachBind, err)
				}
			}
			res, err := peer.Reachability(cmd.Context(), args, reachTimeout, bind)
			if err != nil {
				return err
			}
			return json.NewEncoder(os.Stdout).Encode(res)
		},
	}
	reach.Flags().DurationVar(&reachTimeout, "timeout", 2*time.Second, "give each probe this long")
	reach.Flags().StringVar(&reachBind, "bind", "", "send from this local address")
	cmd.AddCommand(newUDPFloodCmd(), newSYNFloodCmd())
	cmd.AddCommand(reach, server, client, echo, sink, proxy, pingpong, stream, connects, httpServer, httpGets, whoami, bindshow, bindloop, probe, hold, request, pause,
		newPlantCmd(), newVictimCmd(), newFastOpenCmd(), newOpenCmd(), newListenCmd(), fanout)
	return cmd
}

// ipsAndPorts parses the addresses of a peer command's arguments and its
// --ports range.
func ipsAndPorts(args []string, ports string) ([]netip.Addr, []uint16, error) {
	ips := make([]netip.Addr, 0, len(args))
	for _, a := range args {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return nil, nil, fmt.Errorf("parsing IP %q: %w", a, err)
		}
		ips = append(ips, ip)
	}
	ps, err := peer.ParsePorts(ports)
	if err != nil {
		return nil, nil, err
	}
	return ips, ps, nil
}

func newListenCmd() *cobra.Command {
	var ports string
	c := &cobra.Command{
		Use:   "listen --ports A-B IP",
		Short: "Listen on every port of the range and hold the listeners until interrupted",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ips, ps, err := ipsAndPorts(args, ports)
			if err != nil {
				return err
			}
			return peer.ListenMany(cmd.Context(), ips[0], ps, func(n int) { fmt.Fprintln(os.Stderr, "listening", n) })
		},
	}
	c.Flags().StringVar(&ports, "ports", "", "ports, A or A-B")
	return c
}

func newUDPFloodCmd() *cobra.Command {
	var ports string
	var count, sockets int
	var hold time.Duration
	c := &cobra.Command{
		Use:   "udpflood --ports A-B --count N [--sockets S --hold D] IP...",
		Short: "Send N one-byte datagrams from unconnected UDP sockets (in turn), each to another address and port; print how many were sent",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ips, ps, err := ipsAndPorts(args, ports)
			if err != nil {
				return err
			}
			n, release, err := peer.UDPFlood(cmd.Context(), ips, ps, count, sockets)
			if err != nil {
				return err
			}
			defer release()
			fmt.Fprintln(cmd.OutOrStdout(), n)
			select {
			case <-cmd.Context().Done():
			case <-time.After(hold):
			}
			return nil
		},
	}
	c.Flags().StringVar(&ports, "ports", "", "destination ports, A or A-B")
	c.Flags().IntVar(&count, "count", 100000, "datagrams")
	c.Flags().IntVar(&sockets, "sockets", 1, "sockets to send from")
	c.Flags().DurationVar(&hold, "hold", 0, "keep the sockets open this long after sending")
	return c
}

func newSYNFloodCmd() *cobra.Command {
	var ports string
	var count int
	c := &cobra.Command{
		Use:   "synflood --ports A-B --count N IP",
		Short: "Send N SYNs to IP over the ports from sockets closed before their handshake completes (non-blocking connect, then close); print how many were sent",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ips, ps, err := ipsAndPorts(args, ports)
			if err != nil {
				return err
			}
			n, err := peer.SYNFlood(cmd.Context(), ips[0], ps, count)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), n)
			return nil
		},
	}
	c.Flags().StringVar(&ports, "ports", "", "destination ports, A or A-B")
	c.Flags().IntVar(&count, "count", 20000, "SYNs")
	return c
}

func newOpenCmd() *cobra.Command {
	var ports string
	var count int
	var closed bool
	c := &cobra.Command{
		Use:   "open --ports A-B --count N IP",
		Short: "Open N idle TCP connections to IP over the ports and hold them until interrupted",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ips, ps, err := ipsAndPorts(args, ports)
			if err != nil {
				return err
			}
			return peer.Open(cmd.Context(), ips[0], ps, count, closed, func(n int) { fmt.Fprintln(os.Stderr, "open", n) })
		},
	}
	c.Flags().StringVar(&ports, "ports", "", "server ports, A or A-B (connections go round-robin)")
	c.Flags().IntVar(&count, "count", 1000, "connections")
	c.Flags().BoolVar(&closed, "closed", false, "send each server (an echo) a byte and half-close, and hold each connection once the echo's FIN has closed it, its answer unread")
	return c
}

// newPlantCmd is the attacker of the connection-takeover tests.
func newPlantCmd() *cobra.Command {
	var client, server, ports, mode string
	var via uint16
	var hold time.Duration
	c := &cobra.Command{
		Use:   "plant --client IP --server IP:PORT --ports A-B",
		Short: "Plant client sockets with other connections' tuples (run in a network namespace of its own)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := peer.PlantConfig{Mode: mode, ViaPort: via}
			var err error
			if cfg.Client, err = netip.ParseAddr(client); err != nil {
				return fmt.Errorf("--client: %w", err)
			}
			if cfg.Server, err = netip.ParseAddrPort(server); err != nil {
				return fmt.Errorf("--server: %w", err)
			}
			if cfg.Ports, err = peer.ParsePorts(ports); err != nil {
				return fmt.Errorf("--ports: %w", err)
			}
			if mode != "dnat" && mode != "repair" {
				return fmt.Errorf("--mode %q: want dnat or repair", mode)
			}
			ctx := cmd.Context()
			ctx, cancel := context.WithTimeout(ctx, hold)
			defer cancel()
			return peer.Plant(ctx, cfg, os.Stdout, func(n int) { fmt.Fprintln(os.Stderr, "planted", n) })
		},
	}
	c.Flags().StringVar(&client, "client", "", "the victim client's address")
	c.Flags().StringVar(&server, "server", "", "the server's address and port")
	c.Flags().StringVar(&ports, "ports", "", "client ports to plant (A-B)")
	c.Flags().StringVar(&mode, "mode", "dnat", "dnat (netfilter sends the attacker's SYNs to --via-port) or repair (TCP_REPAIR sockets)")
	c.Flags().Uint16Var(&via, "via-port", 9999, "where the attacker accepts its own connections in dnat mode")
	c.Flags().DurationVar(&hold, "for", time.Minute, "hold the sockets this long")
	return c
}

// newVictimCmd is the client of the connection-takeover tests.
func newVictimCmd() *cobra.Command {
	var from, ports string
	c := &cobra.Command{
		Use:   "victim --from IP --ports A-B ADDR:PORT",
		Short: "Connect from each port to an echo server and check every reply",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			addr, err := netip.ParseAddr(from)
			if err != nil {
				return fmt.Errorf("--from: %w", err)
			}
			list, err := peer.ParsePorts(ports)
			if err != nil {
				return fmt.Errorf("--ports: %w", err)
			}
			target, err := netip.ParseAddrPort(args[0])
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			return json.NewEncoder(os.Stdout).Encode(peer.Victim(ctx, addr, list, target))
		},
	}
	c.Flags().StringVar(&from, "from", "", "this client's address")
	c.Flags().StringVar(&ports, "ports", "", "client ports (A-B)")
	return c
}

// newFastOpenCmd is the TCP Fast Open client of the ordering tests.
func newFastOpenCmd() *cobra.Command {
	var conns int
	c := &cobra.Command{
		Use:   "fastopen ADDR:PORT",
		Short: "Connect with TCP Fast Open (data in the SYN, no cookie) and check the echo of two writes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return json.NewEncoder(os.Stdout).Encode(peer.FastOpenClients(ctx, args[0], conns))
		},
	}
	c.Flags().IntVar(&conns, "conns", 20, "connections, one after the other")
	return c
}
