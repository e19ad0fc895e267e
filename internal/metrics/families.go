// Package metrics exposes socklane to Prometheus: a collector that reads
// the datapath's per-CPU BPF counters, the load balancer's per-service
// counters and the programs' kernel run-time statistics at scrape time.
package metrics

import "github.com/prometheus/client_golang/prometheus"

const namespace = "socklane"

// family is one metric family: its name without the namespace, its help
// text, its type and its label names.
type family struct {
	name   string
	help   string
	typ    prometheus.ValueType
	labels []string
}

func (f family) fqName() string { return namespace + "_" + f.name }

// The families the collector exports. docs/metrics.md is generated from
// this list (see doc.go).
var (
	famEstablished   = family{"connections_established_total", "TCP connections of managed sockets established, by role (client: active open, server: passive).", prometheus.CounterValue, []string{"role"}}
	famDecided       = family{"connections_decided_total", "Node-local connections decided, by path: bypass (both ends joined) or tcp (left on the kernel's stack).", prometheus.CounterValue, []string{"path"}}
	famVerdicts      = family{"redirect_verdicts_total", "Redirect verdicts of the sk_msg program (a verdict window covers many sends).", prometheus.CounterValue, nil}
	famRedirBytes    = family{"redirected_bytes_total", "Bytes moved socket to socket by the bypass (lags by less than one verdict window per open connection).", prometheus.CounterValue, nil}
	famWindows       = family{"redirect_windows_total", "Redirect verdicts that also covered the sends after them (a verdict window).", prometheus.CounterValue, nil}
	famFast          = family{"redirect_fast_total", "Redirect verdicts that read nothing of the receiver: the room its queue had at the last read, the messages counted since and the owner's charge still covered the send (sends of at least the verdict window; in redirect_verdicts_total too).", prometheus.CounterValue, nil}
	famPassMsgs      = family{"passed_messages_total", "Messages of managed sockets left to TCP.", prometheus.CounterValue, nil}
	famPassBytes     = family{"passed_bytes_total", "Bytes of managed sockets left to TCP.", prometheus.CounterValue, nil}
	famFallbacks     = family{"fallbacks_total", "Connection directions moved to (or kept on) TCP, by reason; brief and no_peer count whole connections left on TCP without joining, from what was learned of their destination (its recent connections were brief, or found no managed server).", prometheus.CounterValue, []string{"reason"}}
	famEvictions     = family{"socket_evictions_total", "Sockets removed from the bypass map because of their peer.", prometheus.CounterValue, nil}
	famClosed        = family{"sockets_closed_total", "Managed sockets closed.", prometheus.CounterValue, nil}
	famLingers       = family{"socket_lingers_total", "Sockets closed in a bypass map before their close() (a peer's reset, or its FIN after their shutdown) while what was redirected to them was unread: they keep their connection slot until their close(), so that no other connection takes its map key; on the map without the valve after a move to TCP a timer takes them out once that is read (socket_evictions_total), so that FIONREAD and poll count the bytes TCP holds for them.", prometheus.CounterValue, nil}
	famDPErrors      = family{"datapath_errors_total", "Datapath errors, by kind.", prometheus.CounterValue, []string{"error"}}
	famEventsLost    = family{"events_lost_total", "Events dropped because the event ring buffer was full (only while a reader listens), by source.", prometheus.CounterValue, []string{"source"}}
	famCaptured      = family{"capture_messages_total", "Bypassed messages captured by `socklane capture`.", prometheus.CounterValue, nil}
	famCapDropped    = family{"capture_dropped_total", "Bypassed messages a running capture missed, by reason: ring_full (the reader fell behind) or rate_limit.", prometheus.CounterValue, []string{"reason"}}
	famQuota         = family{"quota_refusals_total", "Entries of node-wide tables refused to an owner (a cgroup) holding its quota, by table; `socklane status` names the owners.", prometheus.CounterValue, []string{"table"}}
	famBlockingQuiet = family{"blocking_quiet_total", "Decisions that let an end reading in blocking mode into the bypass because its process handles no signal that can interrupt a read (--blocking-sockets per-process); such ends are otherwise kept on TCP (fallbacks_total{reason=\"blocking\"}).", prometheus.CounterValue, nil}
	famValveBytes    = family{"valve_passed_bytes_total", "Bytes of bypassed connections the open valve passed to TCP while their reader caught up (--slow-readers valve; also in passed_bytes_total).", prometheus.CounterValue, nil}
	famValve         = family{"valve_total", "Valve transitions (--slow-readers valve), by event: opens (a reader's queue neared the valve's limit: its writer's sends pass to TCP, whose window paces it), closes (the reader caught up: the sends are redirected again), clamps (a bypassed socket's TCP window clamped to 64 KiB, so that an opening sends that much through TCP, not the whole window autotuning offered), unclamps (its clamp ended, the valve no longer passing into it: given back, unless autotuning or the application had set another) cwnd_clamps (a writer whose open valve passes sends under 512 bytes held to a congestion window of 2 segments, so that TCP merges them: each segment is a message in the reader's queue) and late_verdicts (readers given the valve's verdict when their writer first found them behind, --reader-verdict late).", prometheus.CounterValue, []string{"event"}}
	famSmallNoDelay  = family{"small_stream_nodelay_total", "Fast one-way streams of small sends kept in the bypass because their writer set TCP_NODELAY (TCP would send each write as a segment of its own); with Nagle on they move to TCP (fallbacks_total{reason=\"small_stream\"}, --small-streams tcp).", prometheus.CounterValue, nil}
	famMsgBudget     = family{"message_budget_total", "Sends that found their receiver's queue holding its budget of messages (4,096: each redirected send pins a KiB of kernel memory until read, charged to no cgroup): the valve opened, or the direction moved to TCP (fallbacks_total{reason=\"backlog\"}).", prometheus.CounterValue, nil}
	famOverlaps      = family{"tcp_overlaps_trimmed_total", "TCP segments passed to a socket in the bypass map (--slow-readers valve) whose head repeated bytes already passed, a retransmission straddling what had arrived: the kernel hands such a segment whole to the socket's sk_skb verdict, which cut the repeated head off so that it reaches the reader once (an overlap that could not be cut is datapath_errors_total{error=\"skb_trim\"}).", prometheus.CounterValue, nil}
	famOverlapBytes  = family{"tcp_overlap_trimmed_bytes_total", "The bytes cut off those segments (tcp_overlaps_trimmed_total).", prometheus.CounterValue, nil}
	famUnpaced       = family{"congestion_unpaced_total", "Bypassed sockets whose congestion control paces its sends (BBR) given cubic (reno where cubic is not built in) before it started, where the valve runs (--slow-readers valve): TCP carries only the valve's pushback on a socket-to-socket path, and pacing made the writer and its reader wait for it. Other congestion controls are left alone.", prometheus.CounterValue, nil}
	famSockets       = family{"bypassed_sockets", "Sockets currently in the bypass map.", prometheus.GaugeValue, nil}

	famLBEvents    = family{"lb_events_total", "Service load balancer events, by event: selected (backends chosen), no_backend (connects and sends refused), affinity_hits, terminating_used, udp_reversed (reply sources turned back into the VIP), peername (getpeername answers turned back into the VIP), conns_tracked (connected sockets recorded for destruction), nat_evicted (a UDP socket's least recently used VIP translation dropped: it talks to more than 32 VIPs), pick_ambiguous (a UDP socket's pick whose backend already answers for another of its VIPs, no other backend to be had), bank_retry (a pick that read the frontend again because an apply published new backends meanwhile), out_of_scope (connects and sends to a service address left to the node's per-packet proxy: --service-lb-scope host, or a pod opted out).", prometheus.CounterValue, []string{"event"}}
	famLBErrors    = family{"lb_errors_total", "Service load balancer errors, by kind.", prometheus.CounterValue, []string{"error"}}
	famLBSelected  = family{"lb_backend_selections_total", "Connections (and unconnected UDP sends) sent to one backend of one service frontend.", prometheus.CounterValue, []string{"service", "frontend", "backend"}}
	famLBRefused   = family{"lb_no_backend_total", "Connects and sends to a service frontend refused because it had no usable backend.", prometheus.CounterValue, []string{"service", "frontend"}}
	famSvcSkipped  = family{"service_skipped", "1 for each service the last apply left out (it breaks a rule, clashes with another service, or does not fit the node's tables); `socklane svc list` and the agent's log say why.", prometheus.GaugeValue, []string{"service"}}
	famLBTracked   = family{"lb_tracked_sockets", "Connected sockets the load balancer remembers a backend for.", prometheus.GaugeValue, nil}
	famPolEvents   = family{"policy_events_total", "Network policy events, by event: denied_connect (connects and sends refused with EPERM), denied_packet (first packets of flows dropped at the server: SYNs, UDP datagrams), first_packet (first packets into isolated pods judged), flow_hits (UDP datagrams judged by a cached flow verdict), replies (UDP answers let through as part of a flow already judged).", prometheus.CounterValue, []string{"event"}}
	famPolVerdict  = family{"policy_verdicts_total", "New flows allowed by a rule of a policy, or denied while a policy isolated the pod, by policy (namespace/name; beyond the first 1000 policies: other).", prometheus.CounterValue, []string{"policy", "verdict"}}
	famPortEvents  = family{"port_events_total", "Port virtualization events per workload (beyond the first 1000 workloads: other), by event: binds (real ports drawn from the pool), shared (binds given the real port the workload holds already: SO_REUSEPORT groups, IPv4 and IPv6 sockets), exhausted (binds refused with EADDRINUSE: no free port in the pool), released (real ports returned), connects (to the workload's own virtual port), routed (from elsewhere, by a route or the workload's address), not_bound (connects and sends refused with ECONNREFUSED: the copy they go to is not listening), foreign_bind (binds refused: the port is another workload's real port), direct (binds to a pool port itself, held so that no pool hands it out).", prometheus.CounterValue, []string{"workload", "event"}}
	famProgRuns    = family{"bpf_program_runs_total", "Runs of each socklane BPF program while the kernel's BPF run-time statistics were on.", prometheus.CounterValue, []string{"program"}}
	famProgSeconds = family{"bpf_program_run_seconds_total", "Time spent in each socklane BPF program while the kernel's BPF run-time statistics were on.", prometheus.CounterValue, []string{"program"}}
	famCollectErr  = family{"collection_errors_total", "Scrapes in which some part of the datapath could not be read.", prometheus.CounterValue, nil}
	famSetting     = family{"datapath_setting", "The settings the running datapath was loaded with, by setting: backlog_limit_bytes, verdict_window_bytes, bypass_blocking, bypass_brief and bypass_small_streams (1: such connections join or stay in the bypass, 0: they stay on or move to TCP; bypass_blocking 0.5: decided per process), backlog_valve (1: a writer whose reader falls behind is pushed back through TCP, 0: its direction moves to TCP), late_verdict (1: connections join without the valve's verdict and a reader gets it when it falls behind, --reader-verdict late).", prometheus.GaugeValue, []string{"setting"}}
	famBuild       = family{"build_info", "Always 1; the labels tell the socklane version and the Go version it was built with.", prometheus.GaugeValue, []string{"version", "goversion"}}
)

var families = []family{
	famEstablished, famDecided, famVerdicts, famRedirBytes, famWindows, famFast, famPassMsgs, famPassBytes,
	famFallbacks, famBlockingQuiet, famValve, famValveBytes, famSmallNoDelay, famMsgBudget, famOverlaps, famOverlapBytes, famUnpaced, famEvictions, famLingers, famClosed, famDPErrors, famSockets, famQuota,
	famEventsLost, famCaptured, famCapDropped,
	famLBEvents, famLBErrors, famLBSelected, famLBRefused, famLBTracked, famSvcSkipped,
	famPolEvents, famPolVerdict, famPortEvents,
	famProgRuns, famProgSeconds, famSetting, famCollectErr, famBuild,
}

// counterRef places one BPF counter in a family, with its label value.
type counterRef struct {
	fam   family
	label string
}

// bypassCounters maps every counter of enum sl_counter (by its BTF name)
// to its metric. A counter missing here fails the tests.
var bypassCounters = map[string]counterRef{
	"established_active":      {famEstablished, "client"},
	"established_passive":     {famEstablished, "server"},
	"conns_bypassed":          {famDecided, "bypass"},
	"conns_tcp":               {famDecided, "tcp"},
	"redirect_msgs":           {famVerdicts, ""},
	"redirect_bytes":          {famRedirBytes, ""},
	"redirect_windows":        {famWindows, ""},
	"redirect_fast":           {famFast, ""},
	"pass_msgs":               {famPassMsgs, ""},
	"pass_bytes":              {famPassBytes, ""},
	"fallback_peer_not_ready": {famFallbacks, "peer_not_ready"},
	"fallback_early_data":     {famFallbacks, "early_data"},
	"fallback_backlog":        {famFallbacks, "backlog"},
	"fallback_peer_gone":      {famFallbacks, "peer_gone"},
	"fallback_blocking":       {famFallbacks, "blocking"},
	"fallback_brief":          {famFallbacks, "brief"},
	"fallback_small_stream":   {famFallbacks, "small_stream"},
	"fallback_no_peer":        {famFallbacks, "no_peer"},
	"fallback_no_handshake":   {famFallbacks, "no_handshake"},
	"fallback_quota":          {famFallbacks, "quota"},
	"fallback_no_listener":    {famFallbacks, "no_listener"},
	"listener_quota":          {famQuota, "listeners"},
	"fallback_bypass_off":     {famFallbacks, "bypass_off"},
	"blocking_quiet":          {famBlockingQuiet, ""},
	"evictions":               {famEvictions, ""},
	"closed":                  {famClosed, ""},
	"lingers":                 {famLingers, ""},
	"err_sockhash":            {famDPErrors, "sockhash"},
	"err_conn_table_full":     {famDPErrors, "conn_table_full"},
	"err_index":               {famDPErrors, "index"},
	"err_storage":             {famDPErrors, "storage"},
	"events_lost":             {famEventsLost, "bypass"},
	"captured":                {famCaptured, ""},
	"capture_lost":            {famCapDropped, "ring_full"},
	"capture_rate_drops":      {famCapDropped, "rate_limit"},
	"evict_timer_quota":       {famQuota, "evict_timers"},
	"msg_quota":               {famQuota, "messages"},
	"fallback_opted_out":      {famFallbacks, "opted_out"},
	"valve_opens":             {famValve, "opens"},
	"valve_closes":            {famValve, "closes"},
	"valve_clamps":            {famValve, "clamps"},
	"valve_unclamps":          {famValve, "unclamps"},
	"valve_cwnd_clamps":       {famValve, "cwnd_clamps"},
	"valve_bytes":             {famValveBytes, ""},
	"small_stream_nodelay":    {famSmallNoDelay, ""},
	"msg_budget":              {famMsgBudget, ""},
	"skb_overlaps":            {famOverlaps, ""},
	"skb_overlap_bytes":       {famOverlapBytes, ""},
	"err_skb_trim":            {famDPErrors, "skb_trim"},
	"cc_unpaced":              {famUnpaced, ""},
	"late_verdicts":           {famValve, "late_verdicts"},
	"err_late_verdict":        {famDPErrors, "late_verdict"},
}

// lbCounters does the same for enum sl_lb_counter.
var lbCounters = map[string]counterRef{
	"selected":            {famLBEvents, "selected"},
	"no_backend":          {famLBEvents, "no_backend"},
	"affinity_hits":       {famLBEvents, "affinity_hits"},
	"terminating_used":    {famLBEvents, "terminating_used"},
	"udp_reversed":        {famLBEvents, "udp_reversed"},
	"peername":            {famLBEvents, "peername"},
	"conns_tracked":       {famLBEvents, "conns_tracked"},
	"err_storage":         {famLBErrors, "storage"},
	"err_conns":           {famLBErrors, "conns_table"},
	"events_lost":         {famEventsLost, "lb"},
	"nat_evicted":         {famLBEvents, "nat_evicted"},
	"pick_ambiguous":      {famLBEvents, "pick_ambiguous"},
	"bank_retry":          {famLBEvents, "bank_retry"},
	"quota":               {famQuota, "lb_conns"},
	"affinity_quota":      {famQuota, "affinity"},
	"out_of_scope":        {famLBEvents, "out_of_scope"},
	"pol_denied_connect":  {famPolEvents, "denied_connect"},
	"pol_denied_packet":   {famPolEvents, "denied_packet"},
	"pol_first_packet":    {famPolEvents, "first_packet"},
	"pol_flow_hits":       {famPolEvents, "flow_hits"},
	"pol_replies":         {famPolEvents, "replies"},
	"pol_replies_spilled": {famPolEvents, "replies_spilled"},
	"pol_replies_quota":   {famQuota, "udp_tables"},
}
