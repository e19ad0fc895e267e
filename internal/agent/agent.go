// Package agent runs socklane on a node: it checks the kernel, mounts
// bpffs, loads or adopts the pinned datapath and attaches it.
package agent

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/cri"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/kube"
	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/policy"
	"github.com/socklane/socklane/internal/ports"
	"github.com/socklane/socklane/internal/service"
	"github.com/socklane/socklane/internal/statesync"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Config of one node agent.
type Config struct {
	// Config names the instance and the settings of a new load.
	node.Config
	// Cgroups to attach to; none means the cgroup v2 root (unless pods
	// are selected).
	Cgroups []string
	// ServicesFile, if set, is a YAML service file the agent applies at
	// start and again whenever its content changes, checked every
	// ServicesInterval (default DefaultServicesInterval).
	ServicesFile     string
	ServicesInterval time.Duration
	// PoliciesFile, if set, is a YAML policy file (NetworkPolicy objects
	// with the namespaces and pods they select) the agent enforces from
	// start and again whenever its content changes, checked as often as
	// the service file.
	PoliciesFile string
	// PortsFile, if set, is a YAML port virtualization file (workloads,
	// their virtual ports and pools, routes) applied at start and again
	// whenever its content changes, or the cgroups its pods and
	// processes resolve to do, checked as often as the service file.
	PortsFile string
	// Web is where and how /metrics and the probes are served.
	Web WebConfig
	// SweepInterval is how often what sockets of detached cgroups left
	// behind is reclaimed (default DefaultSweepInterval).
	SweepInterval time.Duration
	// BPFStats turns the kernel's BPF run-time statistics on while the
	// agent runs (bpf_program_* metrics; costs tens of ns per run).
	BPFStats bool
	// PodSelector (key=value[,...]), if set, keeps the datapath attached
	// to the running pods whose labels match, found through the CRI
	// runtime at CRISocket every PodInterval; pods that go away are
	// detached. Without Cgroups, the root is then not attached.
	PodSelector string
	CRISocket   string
	PodInterval time.Duration
	// KubeServices serves the cluster's Services and EndpointSlices,
	// watched through the API server (Kubeconfig, or the in-cluster
	// configuration when empty). Not with ServicesFile.
	KubeServices bool
	Kubeconfig   string
	// KubePodSelector (Kubernetes label selector syntax), if set, keeps
	// the datapath attached to the pods the API server places on NodeName
	// whose labels match, found in the runtime (CRISocket) by UID.
	KubePodSelector string
	NodeName        string
	// Sync, if set, replicates the maps it names with the peers it lists.
	Sync *statesync.Config
	// SyncLease, if set, elects the active node of the active-standby
	// maps through this Lease (Kubeconfig, or in-cluster).
	SyncLease *statesync.Lease
	// KubePolicies enforces the cluster's NetworkPolicies (with its
	// Namespaces and Pods) on the pods KubePodSelector attaches. Not with
	// PoliciesFile.
	KubePolicies bool
	// SyncPods: with KubePolicies and Sync (whose tables include the pod
	// table), this node's pods are published through the sync and the
	// other nodes' read from it, instead of watching every pod.
	SyncPods bool
	// SyncPodsNodeGrace is how long a node with pods in the pod table may
	// be missing from the cluster's nodes before its pods are deleted
	// (0: podtable.NodeGoneGrace).
	SyncPodsNodeGrace time.Duration
}

// Validate checks the settings that do not need the kernel.
func (c Config) Validate() error {
	if err := c.Settings.Validate(); err != nil {
		return err
	}
	if c.ServicesInterval < 0 || (c.ServicesInterval > 0 && c.ServicesInterval < 10*time.Millisecond) {
		return fmt.Errorf("--services-interval %s: want at least 10ms", c.ServicesInterval)
	}
	if c.KubeServices && c.ServicesFile != "" {
		return errors.New("--kube-services and --services: give one source of services")
	}
	if c.KubePolicies && c.PoliciesFile != "" {
		return errors.New("--kube-policies and --policies: give one source of policies")
	}
	if c.SyncPodsNodeGrace < 0 || (c.SyncPodsNodeGrace > 0 && c.SyncPodsNodeGrace < time.Second) {
		return fmt.Errorf("--sync-pods-node-grace %s: want at least 1s (a node that just joined publishes before every agent lists it)", c.SyncPodsNodeGrace)
	}
	if c.SyncPods && (!c.KubePolicies || c.Sync == nil) {
		return errors.New("--sync-pods publishes and reads pods for --kube-policies through the sync: it needs --kube-policies and --sync-listen")
	}
	if c.KubePolicies && c.KubePodSelector == "" {
		return errors.New("--kube-policies needs --kube-pod-selector: policies are enforced on the pods socklane attaches, found through the container runtime")
	}
	if c.KubePodSelector != "" && c.PodSelector != "" {
		return errors.New("--kube-pod-selector and --pod-selector: give one")
	}
	if c.KubePodSelector != "" && c.NodeName == "" {
		return errors.New("--kube-pod-selector needs this node's name: --node-name, or the NODE_NAME environment variable")
	}
	if c.PodSelector != "" {
		if _, err := cri.ParseSelector(c.PodSelector); err != nil {
			return fmt.Errorf("--pod-selector: %w", err)
		}
	}
	if c.PodInterval < 0 || (c.PodInterval > 0 && c.PodInterval < 100*time.Millisecond) {
		return fmt.Errorf("--pod-interval %s: want at least 100ms", c.PodInterval)
	}
	return nil
}

// targets are the cgroups the agent attaches at start.
func (c Config) targets() []string {
	if len(c.Cgroups) == 0 && c.PodSelector == "" && c.KubePodSelector == "" {
		return []string{node.RootTarget}
	}
	return c.Cgroups
}

// Run starts the agent and waits for ctx. The datapath stays pinned and
// attached when Run returns: restarting the agent resets no connection.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	// The files are read and validated first: a bad one stops the agent
	// before it touches the node. Their appliers use the datapath once
	// it is started.
	var dp *datapath.Datapath
	var svcWatch *fileWatch[*service.Set]
	var svcSet *service.Set
	var svcSum [sha256.Size]byte
	if cfg.ServicesFile != "" {
		svcWatch = &fileWatch[*service.Set]{what: "service", path: cfg.ServicesFile, parse: service.Parse, log: log,
			apply: func(set *service.Set) error {
				st, err := node.ApplyServices(dp, cfg.PinName, set, nil)
				if err != nil {
					return err
				}
				log.Info("services applied", "file", cfg.ServicesFile, "services", len(set.Services), "frontends", st.Frontends,
					"added", st.Added, "updated", st.Updated, "removed", st.Removed,
					"stale_backends", st.Stale, "sockets_destroyed", st.Destroyed, "took", st.Took)
				return nil
			}}
		var err error
		if svcSet, svcSum, err = svcWatch.load(); err != nil {
			return err
		}
	}
	var polWatch *fileWatch[*policy.Set]
	var polSet *policy.Set
	var polSum [sha256.Size]byte
	if cfg.PoliciesFile != "" {
		polWatch = &fileWatch[*policy.Set]{what: "policy", path: cfg.PoliciesFile, parse: policy.Parse, log: log,
			apply: func(set *policy.Set) error {
				res, err := node.ApplyPolicies(dp, cfg.PinName, set, log)
				if err != nil {
					return err
				}
				log.Info("policies applied", "file", cfg.PoliciesFile, "policies", res.Policies, "local_pods", res.Cgroups,
					"rules", res.Rules, "connections_destroyed", res.Destroyed, "compile", res.Compile, "took", res.Took)
				return nil
			}}
		var err error
		if polSet, polSum, err = polWatch.load(); err != nil {
			return err
		}
	}
	var portWatch *fileWatch[*ports.Set]
	var portSet *ports.Set
	var portSum [sha256.Size]byte
	if cfg.PortsFile != "" {
		portWatch = &fileWatch[*ports.Set]{what: "ports", path: cfg.PortsFile, parse: ports.Parse, log: log,
			apply: func(set *ports.Set) error {
				res, err := node.ApplyPorts(ctx, dp, cfg.PinName, set, cfg.CRISocket)
				if err != nil {
					return err
				}
				log.Info("port rules applied", "file", cfg.PortsFile, "workloads", res.Workloads, "virtual_ports", res.VirtualPorts,
					"cgroups", res.Cgroups, "hooked_cgroups", res.Hooked, "took", res.Took)
				return nil
			}}
		var err error
		if portSet, portSum, err = portWatch.load(); err != nil {
			return err
		}
	}
	// The sync's maps and certificates are checked before the node is
	// touched.
	var syncEngine *statesync.Engine
	if cfg.SyncPods {
		if err := cfg.Validate(); err != nil {
			return err
		}
		// The pod table is pinned with the datapath, loaded below; the
		// engine opens it then.
		if err := statesync.Check(*cfg.Sync, datapath.PodTablePin(cfg.PinDir())); err != nil {
			return err
		}
	} else if cfg.Sync != nil {
		var err error
		if syncEngine, err = statesync.New(*cfg.Sync, log); err != nil {
			return err
		}
		defer syncEngine.Close()
	}
	var kubeCfg *rest.Config
	// The API server's services are served with any Kubernetes source (as
	// before the sync's lease, which alone serves none).
	kubeSources := cfg.KubeServices || cfg.KubePodSelector != "" || cfg.KubePolicies
	syncKube := cfg.Sync != nil && (cfg.SyncLease != nil || cfg.Sync.DiscoverPeers)
	if kubeSources || syncKube {
		if err := cfg.Validate(); err != nil {
			return err
		}
		var err error
		if kubeCfg, err = kube.Config(cfg.Kubeconfig); err != nil {
			return err
		}
	}
	web, err := listenHTTP(cfg.Web)
	if err != nil {
		return err
	}
	if web != nil {
		defer web.close()
	}
	var pods *podWatch
	if cfg.PodSelector != "" || cfg.KubePodSelector != "" {
		if err := cfg.Validate(); err != nil {
			return err
		}
		var sel cri.Selector
		if cfg.PodSelector != "" {
			sel, _ = cri.ParseSelector(cfg.PodSelector)
		}
		socket := cfg.CRISocket
		if socket == "" {
			socket = cri.DefaultSocket
		}
		c, err := cri.Dial(ctx, socket)
		if err != nil {
			return err
		}
		defer c.Close()
		pods = &podWatch{c: c, sel: sel, log: log, attached: map[uint64]string{}}
		if cfg.KubePodSelector != "" {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			if pods.fromAPI, err = kube.WatchPods(ctx, kubeCfg, cfg.NodeName, cfg.KubePodSelector, log); err != nil {
				return err
			}
		}
	}
	if cfg.BPFStats {
		stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
		if err != nil {
			return fmt.Errorf("turning on BPF run-time statistics (--bpf-stats): %w", err)
		}
		defer stats.Close()
	}
	dp, _, err = node.Start(cfg.Config, cfg.targets(), log)
	if err != nil {
		return err
	}
	defer dp.Close()
	var remotePods kube.RemotePods
	if cfg.SyncPods {
		if syncEngine, err = statesync.New(*cfg.Sync, log); err != nil {
			return err
		}
		defer syncEngine.Close()
		sp, err := newSyncedPods(ctx, syncEngine, cfg.PinDir(), cfg.NodeName, cfg.SyncPodsNodeGrace, log)
		if err != nil {
			return err
		}
		defer sp.close()
		remotePods = sp
	}
	var files <-chan time.Time
	if svcWatch != nil {
		if err := svcWatch.applyNow(svcSet, svcSum); err != nil {
			return err
		}
	}
	if polWatch != nil {
		if err := polWatch.applyNow(polSet, polSum); err != nil {
			return err
		}
	}
	if portWatch != nil {
		if err := portWatch.applyNow(portSet, portSum); err != nil {
			return err
		}
	}
	if svcWatch != nil || polWatch != nil || portWatch != nil {
		t := tickerOr(cfg.ServicesInterval, DefaultServicesInterval)
		defer t.Stop()
		files = t.C
	}
	var podTick <-chan time.Time
	if pods != nil {
		pods.dp = dp
		pods.reconcile(ctx)
		t := tickerOr(cfg.PodInterval, DefaultPodInterval)
		defer t.Stop()
		podTick = t.C
	}
	kubeDone := make(chan error, 2)
	if cfg.KubePolicies {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			kubeDone <- kube.WatchPolicies(ctx, kubeCfg, cfg.NodeName, 20*time.Millisecond, pods.Cgroups, remotePods, func(set *policy.Set) error {
				res, err := node.ApplyPolicies(dp, cfg.PinName, set, log)
				if err == nil {
					log.Debug("policies programmed", "policies", res.Policies, "local_pods", res.Cgroups, "rules", res.Rules,
						"connections_destroyed", res.Destroyed, "took", res.Took)
				}
				return err
			}, log)
		}()
	}
	if kubeSources {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			kubeDone <- kube.Watch(ctx, kubeCfg, cfg.NodeName, 20*time.Millisecond, dp.ServiceBudget(), func(ch kube.ServiceChanges, since time.Time) error {
				st, whole, err := node.UpdateServices(dp, cfg.PinName, ch.Changes, ch.Whole)
				if err != nil {
					return err
				}
				if web != nil {
					web.programming.Observe(time.Since(since))
				}
				log.Debug("services programmed", "whole", whole, "frontends", st.Frontends, "added", st.Added, "updated", st.Updated,
					"removed", st.Removed, "sockets_destroyed", st.Destroyed, "took", st.Took)
				// Ready once the cluster's services, as listed at
				// start, are programmed.
				if web != nil && !web.ready.Load() {
					web.ready.Store(true)
					log.Info("ready: the first full sync of the cluster's services is applied")
				}
				return nil
			}, log)
		}()
	}
	syncDone := make(chan error, 3)
	if syncEngine != nil {
		ss, err := serveSync(syncEngine, cfg.PinName, log)
		if err != nil {
			return err
		}
		defer ss.close()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { syncDone <- syncEngine.Run(ctx) }()
		if cfg.Sync.DiscoverPeers {
			ns, sel, err := kube.ParsePeerSource(cfg.Sync.PeersFrom)
			if err != nil {
				return err
			}
			_, port, _ := net.SplitHostPort(cfg.Sync.Listen)
			go func() {
				err := kube.WatchSyncPeers(ctx, kubeCfg, ns, sel, port, 200*time.Millisecond, func(ps []kube.SyncPeer) {
					peers := make([]statesync.Peer, 0, len(ps))
					for _, p := range ps {
						peers = append(peers, statesync.Peer{Name: p.Node, Address: p.Address})
					}
					log.Info("sync peers", "peers", len(peers))
					syncEngine.SetPeers(peers)
				}, log)
				if err != nil {
					syncDone <- err
				}
			}()
		}
		if cfg.SyncLease != nil {
			client, err := kubernetes.NewForConfig(kubeCfg)
			if err != nil {
				return fmt.Errorf("--sync-lease: %w", err)
			}
			go func() {
				if err := syncEngine.RunLease(ctx, client, *cfg.SyncLease); err != nil {
					syncDone <- err
				}
			}()
		}
		node, inc := syncEngine.Origin()
		log.Info("state sync running", "node", node, "incarnation", fmt.Sprintf("%016x", inc), "listen", cfg.Sync.Listen,
			"peers", len(cfg.Sync.Peers), "tables", len(cfg.Sync.Tables))
	}
	if web != nil {
		if syncEngine != nil {
			web.sync = syncEngine.Status
		}
		web.serve(dp, cfg.PinName, log)
		if !kubeSources {
			web.ready.Store(true)
		}
	}
	log.Info("agent running; the datapath stays in place when the agent stops (remove it with `socklane down`)")
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	// Sockets of detached cgroups (by hand, or pods gone) close unseen.
	sweep := tickerOr(cfg.SweepInterval, DefaultSweepInterval)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			log.Info("agent stopping", "reason", context.Cause(ctx))
			return nil
		case <-files:
			if svcWatch != nil {
				svcWatch.poll()
			}
			if polWatch != nil {
				polWatch.poll()
			}
			if portWatch != nil {
				portWatch.poll()
				portsFollow(ctx, portWatch, cfg, log)
			}
		case <-podTick:
			pods.reconcile(ctx)
		case err := <-syncDone:
			if err != nil {
				return fmt.Errorf("state sync: %w", err)
			}
		case err := <-kubeDone:
			if err != nil {
				return fmt.Errorf("kubernetes source: %w", err)
			}
		case <-sweep.C:
			node.Reclaim(dp, log)
			if n, err := node.SweepPortClaims(dp); err != nil {
				log.Warn("sweeping port claims", "err", err)
			} else if n > 0 {
				log.Info("real ports returned to their pools: no socket was bound to them", "ports", n)
			}
		case <-tick.C:
			if c, err := dp.Counters(); err == nil {
				log.Info("bypass", "conns_bypassed", c.Get(datapath.CounterConnsBypassed), "redirect_bytes", c.Get(datapath.CounterRedirectBytes))
			}
		}
	}
}

// tickerOr ticks every interval, or every def when interval is 0.
func tickerOr(interval, def time.Duration) *time.Ticker {
	if interval == 0 {
		interval = def
	}
	return time.NewTicker(interval)
}
