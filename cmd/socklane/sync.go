package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/socklane/socklane/internal/agent"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/podtable"
	"github.com/socklane/socklane/internal/statesync"
	"github.com/socklane/socklane/internal/syncpb"
	"github.com/spf13/cobra"
)

// podTablePoll is how often the synced pod table is read and compared
// with what was published (its writes are all published as made).
const podTablePoll = 30 * time.Second

// syncFlags are the agent's state sync flags.
type syncFlags struct {
	listen            string
	peers, maps       []string
	ca, cert, key     string
	digest, bootstrap time.Duration
	logSize           int
	active            bool
	lease             string
	leaseDuration     time.Duration
	takeoverTimeout   time.Duration
	peersFrom         string
	pods              bool
	podsNodeGrace     time.Duration
}

func (f *syncFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "sync-listen", "", "replicate eBPF maps with other nodes: listen for peers here (HOST:PORT); needs --node-name, --sync-map, --sync-ca, --sync-cert and --sync-key")
	fl.StringArrayVar(&f.peers, "sync-peer", nil, "a peer node: NAME=HOST:PORT (repeatable; NAME is the node name in its certificate)")
	fl.StringVar(&f.peersFrom, "sync-peers-from", "", "find the peers through the API server instead: NAMESPACE/SELECTOR of the agents' pods (a DaemonSet's), each running pod a peer named by its node, at its pod address and the --sync-listen port")
	fl.StringArrayVar(&f.maps, "sync-map", nil, "a pinned map to replicate: PATH[,name=NAME][,mode=shared|active-standby][,poll=1s][,changes=DIR][,record=N][,trace=on|off] (repeatable; every node lists the same maps in the same order; changes= names the bpffs directory of the writers' change records, sl_sync.h; without it the kernel's map updates are traced where the kernel allows (fexit; trace=off: never), else the map is read every poll)")
	fl.StringVar(&f.ca, "sync-ca", "", "CA certificate (PEM) that signs every node's sync certificate (socklane sync certs makes one)")
	fl.StringVar(&f.cert, "sync-cert", "", "this node's sync certificate (PEM), naming --node-name; read again at every handshake")
	fl.StringVar(&f.key, "sync-key", "", "the key of --sync-cert (PEM)")
	fl.BoolVar(&f.pods, "sync-pods", false, "with --kube-policies: publish this node's pods to the other nodes through the sync (socklane's pod table) and take theirs from it, instead of watching every pod of the cluster")
	fl.DurationVar(&f.podsNodeGrace, "sync-pods-node-grace", podtable.NodeGoneGrace, "with --sync-pods: how long a node with pods in the pod table may be missing from the cluster's nodes (the API server's) before its pods are deleted from the table")
	fl.DurationVar(&f.digest, "sync-digest-interval", statesync.DefaultDigestInterval, "how often each node sends digests of the entries it wrote (anti-entropy)")
	fl.DurationVar(&f.bootstrap, "sync-bootstrap-timeout", statesync.DefaultBootstrapTimeout, "how long to wait for the peers' state before reading the local maps at start")
	fl.IntVar(&f.logSize, "sync-log-size", statesync.DefaultLogSize, "changes kept for peers that reconnect (a peer further behind gets a snapshot)")
	fl.BoolVar(&f.active, "sync-active", false, "this node is the active one of the active-standby maps (without --sync-lease)")
	fl.StringVar(&f.lease, "sync-lease", "", "elect the active node of the active-standby maps through this Kubernetes Lease (NAMESPACE/NAME; --kubeconfig or the in-cluster configuration); the winner publishes only once it has every change its peers have")
	fl.DurationVar(&f.takeoverTimeout, "sync-takeover-timeout", statesync.DefaultTakeoverTimeout, "with --sync-lease: how long the winner waits to hear from every peer (what they have of the last active node's changes) before it takes over with what it has")
	fl.DurationVar(&f.leaseDuration, "sync-lease-duration", statesync.DefaultLeaseDuration, "how long the lease holds without renewal (a dead active node is replaced after about this long)")
}

// config is nil when the sync is off; the lease is nil without
// --sync-lease.
func (f *syncFlags) config(node, pinDir string) (*statesync.Config, *statesync.Lease, error) {
	if f.listen == "" {
		if len(f.peers)+len(f.maps) > 0 || f.ca+f.cert+f.key+f.lease+f.peersFrom != "" || f.active || f.pods {
			return nil, nil, fmt.Errorf("--sync-peer, --sync-peers-from, --sync-map, --sync-pods, --sync-ca, --sync-cert, --sync-key, --sync-active and --sync-lease need --sync-listen (the address peers connect to)")
		}
		return nil, nil, nil
	}
	if f.peersFrom != "" && len(f.peers) > 0 {
		return nil, nil, fmt.Errorf("--sync-peer and --sync-peers-from: give the peers one way")
	}
	if f.lease != "" && f.active {
		return nil, nil, fmt.Errorf("--sync-active and --sync-lease: give one (with a lease the active node is elected)")
	}
	c := &statesync.Config{
		Node: node, Listen: f.listen, TLS: statesync.TLSFiles{CA: f.ca, Cert: f.cert, Key: f.key},
		DigestInterval: f.digest, BootstrapTimeout: f.bootstrap, LogSize: f.logSize, Active: f.active,
		TakeoverTimeout: f.takeoverTimeout, DiscoverPeers: f.peersFrom != "", PeersFrom: f.peersFrom,
	}
	for _, p := range f.peers {
		peer, err := statesync.ParsePeer(p)
		if err != nil {
			return nil, nil, err
		}
		c.Peers = append(c.Peers, peer)
	}
	for _, m := range f.maps {
		t, err := statesync.ParseTable(m)
		if err != nil {
			return nil, nil, err
		}
		c.Tables = append(c.Tables, t)
	}
	if f.pods {
		// Written by the agent only, each write published as it is made:
		// the map is read again only as a check, never traced (a tracer
		// would cost every hash map write on the node).
		c.Tables = append(c.Tables, statesync.TableConfig{Name: datapath.PodTableName, Path: datapath.PodTablePin(pinDir),
			Mode: syncpb.Mode_MODE_SHARED, Poll: podTablePoll, NoTrace: true})
	}
	if f.digest <= 0 || f.bootstrap <= 0 || f.takeoverTimeout <= 0 {
		return nil, nil, fmt.Errorf("--sync-digest-interval, --sync-bootstrap-timeout and --sync-takeover-timeout must be positive")
	}
	if err := c.Validate(); err != nil {
		return nil, nil, err
	}
	if f.lease == "" {
		return c, nil, nil
	}
	l, err := statesync.ParseLease(f.lease, f.leaseDuration)
	if err != nil {
		return nil, nil, err
	}
	if !slices.ContainsFunc(c.Tables, func(t statesync.TableConfig) bool { return t.Mode == syncpb.Mode_MODE_ACTIVE_STANDBY }) {
		return nil, nil, fmt.Errorf("--sync-lease elects the active node of active-standby maps, and no --sync-map has mode=active-standby")
	}
	return c, &l, nil
}

func newSyncCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sync",
		Short: "State sync of eBPF maps between nodes: status, events, certificates",
	}
	cmd.AddCommand(newSyncStatusCmd(g), newSyncEventsCmd(g), newSyncCertsCmd())
	return cmd
}

func newSyncStatusCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Peers, sequence numbers, lag, resyncs and digests of the running agent's sync",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := agent.ReadSyncStatus(cmd.Context(), g.name)
			if err != nil {
				return err
			}
			switch g.output {
			case "json":
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			case "", "text":
				printSyncStatus(cmd, st)
				return nil
			}
			return fmt.Errorf("-o %s: want text or json", g.output)
		},
	}
	return cmd
}

func newSyncEventsCmd(g *globals) *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "events",
		Short: "What happened to the running agent's sync: peers connected, refused or silent, resyncs and why, divergence, snapshots, lost change records, takeover",
		Long: `Prints the events the agent keeps (its last 1,024), one line each (-o json:
one JSON object per line); with -f, then waits for more until interrupted.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if g.output != "" && g.output != "text" && g.output != "json" {
				return fmt.Errorf("-o %s: want text or json", g.output)
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			var seq uint64
			for wait := false; ; wait = true {
				evs, err := agent.ReadSyncEvents(cmd.Context(), g.name, seq, wait)
				if err != nil {
					if cmd.Context().Err() != nil {
						return nil
					}
					return err
				}
				for _, ev := range evs {
					if g.output == "json" {
						if err := enc.Encode(ev); err != nil {
							return err
						}
					} else {
						fmt.Fprintln(cmd.OutOrStdout(), ev)
					}
					seq = ev.Seq
				}
				if !follow {
					return nil
				}
			}
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "wait for more events until interrupted")
	return cmd
}

func printSyncStatus(cmd *cobra.Command, st statesync.Status) {
	w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "node %s (origin %s), %d changes published (log holds from %d), active: %v, bootstrapped: %v\n",
		st.Node, st.Origin, st.Seq, st.LogFirst, st.Active, st.Bootstrapped)
	if tk := st.Takeover; tk.Leader && !st.Active {
		fmt.Fprintf(w, "lease held since %s, catching up before taking over: %d changes behind (%s)\n", tk.Since.Format(time.RFC3339), tk.Behind, tk.Missing)
	} else if tk.Leader {
		fmt.Fprintf(w, "lease held; active since %s (%d changes behind when elected)\n", tk.TookOver.Format(time.RFC3339), tk.AtLease)
	}
	if st.LastRefusal != "" {
		fmt.Fprintf(w, "last refused peer: %s\n", st.LastRefusal)
	}
	fmt.Fprintln(w, "PEER\tUP\tACKED\tBEHIND\tLAG\tLAST RESYNC\tDIGEST\tERROR")
	for _, p := range st.Peers {
		resync := "-"
		if !p.LastResync.IsZero() {
			resync = fmt.Sprintf("%s ago (%s)", time.Since(p.LastResync).Round(time.Second), p.Resync)
		}
		digest := "-"
		if !p.LastDigest.IsZero() {
			digest = map[bool]string{true: "same", false: "differs"}[p.DigestOK]
		}
		fmt.Fprintf(w, "%s\t%v\t%d\t%d\t%.3fs\t%s\t%s\t%s\n", p.Name, p.Connected, p.Acked, p.Behind, p.LagSeconds, resync, digest, p.Err)
	}
	fmt.Fprintln(w, "TABLE\tMODE\tENTRIES\tTOMBSTONES\tPUBLISHING\tCAPTURE")
	for _, t := range st.Tables {
		capture := t.Capture
		if t.Capture == statesync.CapturePoll && t.CaptureWhy != "" {
			capture += " (not traced: " + t.CaptureWhy + ")"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%v\t%s\n", t.Name, t.Mode, t.Entries, t.Tombstones, t.Publishing, capture)
	}
	c := st.Counters
	fmt.Fprintf(w, "published %d, sent %d, applied %d, stale %d, resent %d, dropped %d, snapshots sent %d applied %d, resyncs %d, refused %d, diverged %d, lost records %d, map reads %d\n",
		c.Published, c.Sent, c.Applied, c.Stale, c.Resent, c.Dropped, c.SnapshotsSent, c.SnapshotsApplied, c.Resyncs, c.Refused, c.Diverged, c.LostRecords, c.Polls)
	w.Flush()
}

func newSyncCertsCmd() *cobra.Command {
	var dir string
	var validity time.Duration
	cmd := &cobra.Command{
		Use:   "certs NODE...",
		Short: "Make a sync CA (unless --dir has one) and a certificate for each node",
		Long: `Writes ca.pem and ca-key.pem (kept if present) and NODE.pem, NODE-key.pem
for each node into --dir. Give each node its own certificate and key and
everyone the CA (not its key): a Kubernetes Secret per node, or files.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, nodes []string) error {
			if err := statesync.MakeCerts(dir, nodes, validity); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote the CA and %s into %s\n", strings.Join(nodes, ", "), dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory to write into (made if missing, mode 0700)")
	cmd.Flags().DurationVar(&validity, "validity", 365*24*time.Hour, "how long the certificates are valid")
	_ = cmd.MarkFlagRequired("dir")
	return cmd
}
