package main

import (
	"os"
	"time"

	"github.com/socklane/socklane/internal/agent"
	"github.com/socklane/socklane/internal/cri"
	"github.com/spf13/cobra"
)

func newAgentCmd(g *globals) *cobra.Command {
	var cgs []string
	var set settingsFlags
	var servicesFile string
	var servicesInterval time.Duration
	var policiesFile, portsFile string
	var kubePolicies bool
	var webCfg agent.WebConfig
	var bpfStats bool
	var podSelector, criSocket string
	var podInterval, sweepInterval time.Duration
	var kubeServices bool
	var kubeconfig, kubePodSelector, nodeName string
	var sf syncFlags
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the node agent in the foreground (loads or adopts the datapath and attaches it)",
		Long: `Runs the node agent. It checks the kernel, mounts bpffs if needed, loads the
datapath (or adopts the one already pinned) and attaches it to the cgroup v2
root, or to the cgroups given with --cgroup. Stopping or killing the agent
leaves the datapath in place: live connections are not touched. Remove
socklane with 'socklane down'.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			cfg := agent.Config{Config: set.config(g), Cgroups: cgs}
			cfg.ServicesFile, cfg.ServicesInterval = servicesFile, servicesInterval
			cfg.PoliciesFile, cfg.KubePolicies = policiesFile, kubePolicies
			cfg.PortsFile = portsFile
			cfg.Web, cfg.BPFStats, cfg.SweepInterval = webCfg, bpfStats, sweepInterval
			cfg.PodSelector, cfg.CRISocket, cfg.PodInterval = podSelector, criSocket, podInterval
			cfg.KubeServices, cfg.Kubeconfig = kubeServices, kubeconfig
			cfg.KubePodSelector, cfg.NodeName = kubePodSelector, nodeName
			sc, lease, err := sf.config(nodeName, cfg.PinDir())
			if err != nil {
				return err
			}
			cfg.Sync, cfg.SyncLease, cfg.SyncPods, cfg.SyncPodsNodeGrace = sc, lease, sf.pods, sf.podsNodeGrace
			return agent.Run(ctx, cfg, g.logger(os.Stderr))
		},
	}
	cmd.Flags().StringArrayVar(&cgs, "cgroup", nil, "cgroup v2 directory to attach to (repeatable; default: the cgroup v2 root)")
	cmd.Flags().StringVar(&servicesFile, "services", "", "YAML service file to apply at start and again whenever it changes (a bad file is refused at start; later, it is logged and the applied services stay)")
	cmd.Flags().DurationVar(&servicesInterval, "services-interval", agent.DefaultServicesInterval, "how often to check the service and policy files for changes")
	cmd.Flags().StringVar(&policiesFile, "policies", "", "YAML policy file (NetworkPolicy objects, the namespaces and pods they select) to enforce from start and again whenever it changes (a bad file is refused at start; later, it is logged and the applied policies stay)")
	cmd.Flags().StringVar(&webCfg.MetricsAddress, "metrics-address", agent.DefaultMetricsAddress, "serve Prometheus /metrics, /healthz and /readyz here (\"\" for none); an address other pods can reach needs --web-config-file or --metrics-insecure")
	cmd.Flags().StringVar(&webCfg.WebConfigFile, "web-config-file", "", "Prometheus exporter web configuration (TLS, client certificates, basic auth) for --metrics-address")
	cmd.Flags().BoolVar(&webCfg.MetricsInsecure, "metrics-insecure", false, "serve /metrics on a non-loopback --metrics-address without TLS or authentication (every pod of the node can read every Service's backends)")
	cmd.Flags().StringVar(&webCfg.HealthAddress, "health-address", "", "also serve /healthz and /readyz alone here, without TLS or authentication, for probes (such as 127.0.0.1:9465 when /metrics needs client credentials)")
	cmd.Flags().BoolVar(&bpfStats, "bpf-stats", false, "turn the kernel's BPF run-time statistics on while the agent runs (per-program run counts and time in /metrics)")
	cmd.Flags().StringVar(&podSelector, "pod-selector", "", "attach to the running pods whose labels match key=value[,key=value] (found through the container runtime; pods that start later are attached, pods that go away detached); without --cgroup the cgroup v2 root is then not attached")
	cmd.Flags().StringVar(&criSocket, "cri-socket", cri.DefaultSocket, "the container runtime's CRI socket (for --pod-selector)")
	cmd.Flags().DurationVar(&podInterval, "pod-interval", agent.DefaultPodInterval, "how often to list pods for --pod-selector")
	cmd.Flags().DurationVar(&sweepInterval, "sweep-interval", agent.DefaultSweepInterval, "how often to reclaim the connection slots and load balancer entries of sockets that closed while their cgroup was detached")
	cmd.Flags().StringVar(&portsFile, "ports", "", "YAML port virtualization file (workloads, virtual ports, pools, routes) to apply from start and again whenever it, or the cgroups its workloads resolve to, change (a bad file is refused at start; later, it is logged and the applied rules stay)")
	cmd.Flags().BoolVar(&kubePolicies, "kube-policies", false, "enforce the cluster's NetworkPolicies (watched with its Namespaces and Pods through the API server) on the pods --kube-pod-selector attaches")
	cmd.Flags().BoolVar(&kubeServices, "kube-services", false, "serve the cluster's Services and EndpointSlices, watched through the Kubernetes API server")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "with --kube-services or --kube-pod-selector: kubeconfig file (default: the in-cluster configuration)")
	cmd.Flags().StringVar(&kubePodSelector, "kube-pod-selector", "", "attach to the pods the API server places on this node whose labels match this Kubernetes label selector (found in the runtime by UID; pods that go away are detached)")
	cmd.Flags().StringVar(&nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name in the cluster (for --kube-pod-selector)")
	sf.add(cmd)
	set.add(cmd)
	return cmd
}
