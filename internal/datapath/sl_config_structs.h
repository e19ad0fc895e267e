/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: the load-time settings both objects share. */
#ifndef SL_CONFIG_STRUCTS_H
#define SL_CONFIG_STRUCTS_H

#include "sl_consts.h"

/* The datapath's load-time settings: the one const volatile of each
 * object (sl_settings in bypass.c and servicelb.c, both written from the
 * same value), filled by the loader before the programs load and read back
 * from their read-only data. Go carries the generated type from flag
 * parsing to the loader (datapath.Settings). */
struct sl_config {
	/* SL_MODE_ON: connections between managed sockets are bypassed.
	 * Off: every one stays on TCP (no socket enters the map, no sk_msg
	 * verdict runs): --bypass auto's choice on a kernel whose sockmap
	 * would break programs socklane cannot tell apart (FIONREAD answering
	 * 0 for redirected bytes, no count of queued bytes for the backlog
	 * rule, lost epoll wake-ups or FINs). */
	enum sl_mode bypass;
	/* Receiver backlog (bytes queued in the peer's socket) above which a
	 * direction moves to TCP, whose window then pushes back on the
	 * sender; one message per SL_MSG_COST of it is the peer's budget of
	 * queued messages (msg_budget). 0 disables the check; a request's 0
	 * loads net.ipv4.tcp_rmem[2]. */
	__u32 backlog_limit;
	/* Sends smaller than this many bytes redirect under one verdict for
	 * the next verdict_window bytes (bpf_msg_apply_bytes): the kernel
	 * then moves them without running sl_msg, which is most of a small
	 * send's cost. Larger sends under SL_LARGE_WINDOW (256 KiB) open a
	 * window of SL_LARGE_WINDOW bytes. Either only within half the peer's
	 * budget of messages (msgs_held). The program runs again once a
	 * window is used up, so every decision (backlog, fallback) is at
	 * most one window late. A direction's first send never opens one: its verdict
	 * count is exact up to there, which is what tells a brief connection.
	 * 0: a verdict per send, whatever its size. */
	__u32 verdict_window;
	/* SL_MODE_ON: connections with an end that reads in blocking mode are
	 * bypassed too. Otherwise they stay on TCP: the kernel's sockmap
	 * receive path (tcp_bpf_recvmsg) may answer a blocking read that a
	 * signal interrupts with EAGAIN instead of restarting it, which plain
	 * TCP never does. */
	enum sl_mode bypass_blocking;
	/* SL_MODE_ON: every connection joins. Otherwise brief connections
	 * (one request, one reply, close), which gain nothing from the bypass
	 * and pay for joining it (two psocks and their map entries set up and
	 * torn down, tens of microseconds on a connection that costs a
	 * hundred or two), and connections to a remote or unmanaged server
	 * (whose client joins and leaves alone) are learnt per client network
	 * namespace and destination and left on TCP (SL_BRIEF_* in
	 * sl_consts.h). */
	enum sl_mode bypass_brief;
	/* SL_MODE_ON: every bypassed direction stays bypassed whatever it
	 * sends. Otherwise a direction streaming small sends one way, fast
	 * (SL_STREAM_* in sl_consts.h), from a writer that leaves Nagle on,
	 * moves to TCP, which coalesces them: a stream of 1-64 byte writes is
	 * up to three times faster on TCP across CPUs. */
	enum sl_mode bypass_small_streams;
	/* SL_MODE_ON: a writer whose reader falls behind is pushed back
	 * through TCP while the reader catches up (the valve, SL_VALVE_* in
	 * sl_consts.h; an sk_skb verdict on the map puts TCP's bytes in the
	 * same queue as the redirected ones). Otherwise the backlog rule
	 * moves the direction to TCP for good (backlog_limit). */
	enum sl_mode backlog_valve;
	/* SL_MODE_ON (with the valve): every connection joins
	 * sl_sockmap_plain (reads on the kernel's plain receive path), and a
	 * reader gets the valve's verdict (sl_sockmap_late) from the kernel
	 * when its writer first finds it behind by SL_LATE_ASK_BYTES or half
	 * its budget of messages, or its owner's quota of messages refuses a
	 * send (late_ask, late_join); until then, and where it cannot be
	 * given, its direction runs under the backlog rule. Otherwise every connection
	 * joins the valve's map, sl_sockmap. */
	enum sl_mode late_verdict;
	/* What one owner (the cgroup of a socket, or of the process making
	 * it: a pod's container) may hold of the node-wide tables (defaults
	 * and bounds: enum sl_quota). Beyond it, its new connections stay on
	 * TCP, its listeners are not learned (their connections stay on TCP),
	 * its connected sockets to service addresses are not recorded for
	 * destruction; other owners keep what they get. A request's 0 loads
	 * the default. */
	__u32 owner_conns;     /* connection slots */
	__u32 owner_listeners; /* listener entries */
	__u32 owner_lb_conns;  /* translated connected sockets */
	__u32 owner_affinity;  /* ClientIP affinity entries (client namespace, frontend) */
	__u32 owner_udp_tables; /* unconnected UDP sockets' exchange tables (sl_pol_replies: one each;
				 * sl_pol_replies_more: two) */
	__u32 owner_evict_timers; /* timers of sockets waiting to leave the map, charged to their
				   * connection's owner: each checks up to 1,000 times a second */
	__u32 owner_msgs; /* messages its connections' sends hold in their receivers' queues
			   * (SL_MSG_CHUNK and SL_MSG_LIGHT in sl_consts.h) */
	/* SL_MODE_ON: the service load balancer translates at connect() only
	 * for sockets of the host's network namespace (host_netns); pods'
	 * connects to service addresses are left to the node's per-packet
	 * proxy (kube-proxy), so a service mesh's sidecar sees the cluster
	 * IP. Off: every managed socket, but those of network namespaces
	 * opted out (sl_lb_optout). */
	enum sl_mode lb_host_only;
	/* Not a user setting: the network namespace cookie of the host (the
	 * loader's own; the agent runs in it). */
	__u64 host_netns;
	/* Not a user setting: 1 where the kernel parses the kptr in
	 * sl_listener_val (the loader probes it; 6.1 does not, and the
	 * branches that use it are then dead code the verifier never sees). */
	__u32 listener_kptr;
};


/* What a datapath loads with unless the loader says otherwise. */
#define SL_SETTINGS_DEFAULT {                                      \
	.bypass = SL_MODE_ON,                                      \
	.backlog_limit = SL_DEFAULT_BACKLOG_LIMIT,                 \
	.verdict_window = SL_DEFAULT_VERDICT_WINDOW,               \
	.bypass_blocking = SL_MODE_OFF,                            \
	.bypass_brief = SL_MODE_OFF,                               \
	.bypass_small_streams = SL_MODE_OFF,                       \
	.backlog_valve = SL_MODE_OFF,                              \
	.owner_conns = SL_OWNER_CONNS,                             \
	.owner_listeners = SL_OWNER_LISTENERS,                     \
	.owner_lb_conns = SL_OWNER_LB_CONNS,                       \
	.owner_affinity = SL_OWNER_AFFINITY,                       \
	.owner_udp_tables = SL_OWNER_UDP_TABLES,                   \
	.owner_evict_timers = SL_OWNER_EVICT_TIMERS,               \
	.owner_msgs = SL_OWNER_MSGS,                               \
	.lb_host_only = SL_MODE_OFF,                               \
	.listener_kptr = 1,                                        \
}

#endif
