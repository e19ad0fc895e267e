package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/socklane/socklane/internal/bench"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/peer"
	"github.com/spf13/cobra"
)

func newBenchCmd(g *globals) *cobra.Command {
	o := bench.Options{Placements: bench.DefaultPlacements()}
	so := bench.SyncOptions{}
	var jsonOut, mdOut, svgOut, ioMode string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the bypass against the kernel's TCP and AF_UNIX between two pods",
		Long: `Sets up pods on a node bridge and runs, with the bypass off and on and over
AF_UNIX, interleaved and repeated: ping-pong latency and stream throughput per
message size, the tcp-bypasser 1 KiB echo, and short connections, pod to pod,
over loopback inside one pod, and from the host to a pod, with client and
server pinned to one CPU and to two. qperf, sockperf and iperf3, where
installed, run pod to pod beside socklane's own client. The services
measurement programs N services as kube-proxy's iptables rules and through
socklane's connect-time load balancer and compares short connections to one of
them, and to a backend's own address with no service at all (the floor of any
load balancer), and the programming time. Reports medians and ratios.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			mode, err := peer.ParseIO(ioMode)
			if err != nil {
				return err
			}
			o.IO = mode
			o.BPFFS = g.bpffs
			o.Log = g.logger(os.Stderr)
			o.Progress = os.Stderr
			var syncRep *bench.SyncReport
			if i := slices.Index(o.Kinds, bench.Sync); i >= 0 {
				o.Kinds = slices.Delete(o.Kinds, i, i+1)
				so.BPFFS, so.Reps, so.Log, so.Progress = g.bpffs, o.Reps, o.Log, os.Stderr
				if syncRep, err = bench.RunSync(ctx, so); err != nil {
					return err
				}
			}
			write := func(path string, f func(*os.File) error) error {
				if path == "" {
					return nil
				}
				fh, err := os.Create(path)
				if err != nil {
					return fmt.Errorf("creating %s: %w", path, err)
				}
				if err := f(fh); err != nil {
					fh.Close()
					return err
				}
				return fh.Close()
			}
			if len(o.Kinds) == 0 {
				if err := write(jsonOut, func(f *os.File) error { return writeJSON(f, syncRep) }); err != nil {
					return err
				}
				if err := write(mdOut, func(f *os.File) error { syncRep.Markdown(f); return nil }); err != nil {
					return err
				}
				if g.json() {
					return writeJSON(cmd.OutOrStdout(), syncRep)
				}
				syncRep.Markdown(cmd.OutOrStdout())
				return nil
			}
			rep, err := bench.Run(ctx, o)
			if err != nil {
				return err
			}
			rep.Sync = syncRep
			if err := write(jsonOut, func(f *os.File) error { return writeJSON(f, rep) }); err != nil {
				return err
			}
			if err := write(svgOut, func(f *os.File) error { return rep.SVG(f) }); err != nil {
				return err
			}
			if err := write(mdOut, func(f *os.File) error { rep.Markdown(f); return nil }); err != nil {
				return err
			}
			if g.json() {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(rep)
			}
			rep.Markdown(cmd.OutOrStdout())
			return nil
		},
	}
	cmd.AddCommand(newBenchScrapeCmd(g))
	f := cmd.Flags()
	f.IntVar(&o.Reps, "reps", 5, "interleaved repetitions (medians are reported)")
	f.IntSliceVar(&o.Sizes, "sizes", []int{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536}, "message sizes in bytes")
	f.IntVar(&o.Count, "count", 20000, "round trips per latency run")
	f.DurationVar(&o.Duration, "duration", time.Second, "length of each throughput run")
	f.IntVar(&o.EchoCount, "echo-count", 250000, "echoed 1 KiB requests (the tcp-bypasser experiment)")
	f.IntVar(&o.Connects, "connects", 2000, "short connections per run")
	f.StringSliceVar(&o.Kinds, "measure", bench.Kinds(), "measurements: latency, throughput, echo, connect, services (kube-proxy iptables rules against socklane's load balancer), policies (connects and a stream under N network policies against none), ports (bind and connect under N port virtualization workloads against none; not in the default), sync (the state sync between two nodes: replicated updates per second, convergence latency, initial sync, change-capture cost; not in the default)")
	f.IntVar(&so.Updates, "sync-updates", 1000000, "sync: updates per throughput run")
	f.IntVar(&so.Rate, "sync-rate", 10000, "sync: steady updates per second of the latency runs")
	f.DurationVar(&so.RateDuration, "sync-rate-duration", 5*time.Second, "sync: length of each latency run")
	f.IntVar(&so.Initial, "sync-initial", 1000000, "sync: entries of the initial sync")
	f.IntVar(&so.Sessions, "sync-sessions", 50000, "sync: sessions of the seed's demo")
	f.IntVar(&so.CaptureWrites, "sync-capture-writes", 400000, "sync: writes per run of the change-capture cost")
	f.IntSliceVar(&o.PolicyCounts, "policy-counts", []int{1000, 10000}, "numbers of policies for the policies measurement")
	f.IntSliceVar(&o.PortRuleCounts, "port-rule-counts", []int{1, 1000}, "numbers of workload rules for the ports measurement")
	f.IntSliceVar(&o.ServiceCounts, "service-counts", []int{100, 1000, 10000}, "numbers of services for the services measurement")
	f.IntVar(&o.IptablesMaxServices, "iptables-max-services", 10000, "most services the iptables baseline is programmed with (iptables-restore takes minutes from 10,000); larger counts measure socklane alone")
	f.Uint32Var(&o.VerdictWindow, "verdict-window", datapath.DefaultVerdictWindow, "the bypass's verdict window in bytes (0: a verdict per send)")
	f.StringVar(&ioMode, "io", string(peer.IOBlocking), "socket I/O of socklane's own clients and servers: blocking (one system call per operation, as qperf and netperf; what is timed is the kernel's path) or netpoll (Go's net package: epoll and goroutine wake-ups, as event-driven servers)")
	f.BoolVar(&o.DefaultSettings, "default-settings", false, "load the datapath with the agent's defaults (blocking readers decided per process, as the kernel's bugs say) instead of bypassing every connection, and report which path each program's connections took, and why")
	f.BoolVar(&o.BypassSmallStreams, "bypass-small-streams", false, "keep fast one-way streams of small sends in the bypass (by default the datapath moves them to TCP, which coalesces them)")
	f.BoolVar(&o.LateVerdict, "reader-verdict-late", false, "let connections join without the valve's sk_skb verdict and give a reader that falls behind the verdict then, from the kernel (the datapath's --reader-verdict late): reads take the kernel's plain receive path until then")
	f.BoolVar(&o.SlowReadersTCP, "slow-readers-tcp", false, "move a direction whose reader falls behind to TCP for good (the datapath's --slow-readers tcp) instead of pushing its writer back through TCP while the reader catches up (the valve, the default where the kernel runs it)")
	f.BoolVar(&o.BareStreamVerdict, "bare-stream-verdict", false, "give the bare redirect a pass-through sk_skb stream verdict, as the valve gives socklane's map: its sockets then read through the kernel's parser receive path (tcp_bpf_recvmsg_parser), as socklane's do under the valve, and the two differ by socklane's programs only")
	f.BoolVar(&o.Control, "control", false, "measure the bare redirect twice in every repetition of socklane's own latency and throughput cases and report the second run against the first beside socklane against the bare redirect: the spread this machine puts between two runs of one path")
	f.BoolVar(&o.BypassBrief, "bypass-brief", false, "join every connection to the bypass, also those to destinations whose recent connections were brief (by default the datapath learns them and leaves them on TCP)")
	f.BoolVar(&o.BPFStats, "bpf-stats", true, "turn on the kernel's BPF run-time statistics for the run and report each program's cost (they add two clock reads to every program run)")
	f.StringSliceVar(&o.Scenarios, "scenarios", bench.Scenarios(), "scenarios: pod-to-pod, loopback, host-to-pod")
	f.StringSliceVar(&o.Tools, "tools", bench.InstalledTools(), "external tools run pod to pod beside socklane's client: qperf, sockperf, iperf3 (default: those installed; \"\" for none), and programs asked for by name: redis (redis-server and redis-benchmark, one client's GET round trips), redis-cli (the same GETs from redis-cli, a blocking reader), python (http.server and urllib, a file fetched over a new connection each time: --tool-sizes), java (Java's blocking sockets, ping-pong), nginx (nginx and curl, GETs over one kept-alive connection), go-http (Go's net/http server and client, likewise), postgres (postgres and pgbench, one client's select-only transactions; its own message sizes)")
	f.IntSliceVar(&o.ToolSizes, "tool-sizes", []int{1, 64, 1024, 16384, 65536}, "message sizes for the external tools")
	f.DurationVar(&o.ToolDuration, "tool-duration", time.Second, "length of each external tool run (whole seconds)")
	f.StringVar(&jsonOut, "json", "", "also write the full report as JSON to this file")
	f.StringVar(&mdOut, "markdown", "", "also write the tables as Markdown to this file")
	f.StringVar(&svgOut, "svg", "", "also write a chart of bypass/TCP ratios as SVG to this file")
	return cmd
}

func newBenchScrapeCmd(g *globals) *cobra.Command {
	o := bench.ScrapeOptions{}
	cmd := &cobra.Command{
		Use:   "scrape",
		Short: "Measure a /metrics scrape on a node with many services and bypassed connections",
		Long: `Programs --services services, opens --conns bypassed connections between two
pods (two sockets each in the bypass map), and times the agent's collector
(a full Prometheus gather) --reps times, interleaved with a count of the
node's tables (the bypass map and the translated-socket table), which the
agent does in the background at most every 10 s.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			o.BPFFS, o.Log = g.bpffs, g.logger(os.Stderr)
			rep, err := bench.Scrape(ctx, o)
			if err != nil {
				return err
			}
			if g.json() {
				return writeJSON(cmd.OutOrStdout(), rep)
			}
			rep.Text(cmd.OutOrStdout())
			return nil
		},
	}
	cmd.Flags().IntVar(&o.Services, "services", 10000, "services programmed")
	cmd.Flags().IntVar(&o.Conns, "conns", 30000, "bypassed connections held open (two sockets each)")
	cmd.Flags().IntVar(&o.Reps, "reps", 9, "scrapes (the median is reported)")
	return cmd
}
