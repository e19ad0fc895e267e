/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: data structures of the service load balancer, shared with Go
 * through BTF. Addresses are IPv6 or IPv4-mapped IPv6 in network order,
 * ports in host order. */
#ifndef SL_LB_STRUCTS_H
#define SL_LB_STRUCTS_H

#include <linux/types.h>
#include "sl_consts.h"

/* A service frontend: virtual IP, port and protocol (IPPROTO_TCP/UDP). */
struct sl_svc_key {
	__u32 ip[4];
	__u16 port;
	__u8 proto;
	__u8 pad;
};

/* What a frontend balances over. Backends [0, ready) of the live bank are
 * ready, [ready, ready + terminating) terminating (used only when none is
 * ready). A new backend set is written to the other bank and published by
 * one update of this value. */
struct sl_svc_val {
	__u32 id;          /* stable frontend id, keys backends, affinity and stats */
	__u16 bank;        /* live backend bank: 0 or 1 */
	__u16 flags;
	__u16 ready;
	__u16 terminating;
	__u32 affinity_s;  /* ClientIP affinity timeout in seconds; 0: none */
};

/* sl_svc_val.flags */
enum sl_svc_flag {
	/* Backends chosen by Maglev over the client's network namespace
	 * (sl_svc_maglev), not at random: a client pod keeps its backend
	 * while it stays, and a change of backends moves the fewest. */
	SL_SVC_MAGLEV = 1,
};

/* A frontend's Maglev table for one bank of its backends. */
struct sl_maglev_key {
	__u32 id;
	__u32 bank;
};

struct sl_maglev {
	__u16 slot[SL_MAGLEV_SIZE]; /* index of a ready backend in the bank */
};

struct sl_backend_key {
	__u32 id;
	__u32 slot;        /* bank << 16 | index */
};

struct sl_backend {
	__u32 ip[4];
	__u16 port;
	__u16 pad;
};

/* Membership of a backend in a frontend: affinity checks it, and the
 * per-backend selection counters share its key. */
struct sl_member_key {
	__u32 id;
	__u32 pad;
	struct sl_backend be;
};

/* A member's state. An idle member (not ready, or excluded from this node's
 * choices by internalTrafficPolicy or topology) is never chosen, and
 * affinity to it lapses, but its established connections stay: only a
 * backend that leaves the members has its sockets destroyed. */
enum sl_member_state {
	SL_MEMBER_READY = 1,
	SL_MEMBER_TERMINATING = 2,
	SL_MEMBER_IDLE = 3,
};

struct sl_member {
	__u32 state;       /* enum sl_member_state */
	__u32 pad;
};

/* ClientIP affinity, per client network namespace: the containers of a
 * pod share one, as they share its address (and host-network processes
 * share the node's, as they share its address): what kube-proxy keys by
 * source address. A new entry is charged to the cgroup of the connecting
 * process (sl_lb_owner.affinity, quota owner_affinity): a pod making
 * network namespaces gets no more entries than its quota, and cannot push
 * out others'. */
struct sl_affinity_key {
	__u64 netns;
	__u32 id;
	__u32 pad;
};

/* What one owner (a cgroup id) holds of sl_lb_conns, and was refused. */
struct sl_lb_owner {
	__u64 conns;
	__u64 refused;
	__u64 affinity;         /* sl_svc_affinity entries */
	__u64 affinity_refused; /* entries not made: over the quota */
	__u64 udp_tables;         /* exchange tables of its UDP sockets (sl_pol_replies one, sl_pol_replies_more two) */
	__u64 udp_tables_refused; /* tables not made: over the quota */
};

/* What the agent hands sl_lb_forget: a translated socket that closed
 * unseen. */
struct sl_lb_forget_args {
	__u64 cookie;
};

struct sl_affinity {
	struct sl_backend be;
	__u64 last_ns;
	__u64 owner;       /* cgroup id charged for the entry */
};

/* What the agent hands sl_lb_affinity_expire: an entry it found expired
 * (or of a frontend gone), with the last use it saw: a use since keeps
 * the entry. */
struct sl_lb_affinity_args {
	struct sl_affinity_key key;
	__u64 last_ns;
};

/* One translation a socket made: the virtual address it asked for and the
 * backend it got; used is the socket's clock (sl_lb_sock.clock) at its last
 * send there. */
struct sl_nat {
	struct sl_backend vip;
	struct sl_backend be;
	__u32 used;
};

/* Translations one socket keeps: the least recently used goes when a
 * socket talks to more VIPs than this (SL_LB_NAT_EVICTED counts it; a
 * reply from its backend then shows the backend's address). */
#define SL_LB_SOCK_NATS 32

/* Backends tried, when a UDP socket's pick is ambiguous (its backend and
 * port already answer for another VIP of the socket), before taking it. */
#define SL_LB_PICK_TRIES 4

/* Re-reads of a frontend whose backend slot was gone (an apply published
 * a new set between the frontend's lookup and the slot's). */
#define SL_LB_BANK_RETRIES 2

/* Per-socket translations (socket storage): getpeername answers with the
 * VIP, and replies to unconnected UDP sends appear to come from it. */
struct sl_lb_sock {
	struct sl_nat nat[SL_LB_SOCK_NATS];
	__u32 clock;
	__u32 pad;
};

/* A connected socket (TCP, or UDP after connect()) that the load balancer
 * sent to a backend, keyed by socket cookie: when the backend leaves the
 * frontend, the agent finds its sockets here and destroys them, and a TCP
 * socket's getpeername finds its VIP here (TCP sockets get no storage). */
struct sl_lb_conn {
	struct sl_member_key member; /* frontend id and backend */
	struct sl_backend vip;       /* the address connect() asked for */
	__u64 netns;                 /* network namespace cookie of the socket */
	__u64 owner;                 /* cgroup id charged for the entry */
	__u8 proto;                  /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad[7];
};

/* Per-CPU counters of the load balancer. */
enum sl_lb_counter {
	SL_LB_SELECTED = 0,     /* backends chosen (connect and unconnected UDP sends) */
	SL_LB_NO_BACKEND,       /* sends or connects refused: no ready or terminating backend */
	SL_LB_AFFINITY_HITS,    /* choices made by ClientIP affinity */
	SL_LB_TERMINATING_USED, /* choices of a terminating backend (none ready) */
	SL_LB_UDP_REVERSED,     /* datagrams whose source was turned back into the VIP */
	SL_LB_PEERNAME,         /* getpeername answers turned back into the VIP */
	SL_LB_ERR_STORAGE,      /* socket storage unavailable: VIP not remembered */
	SL_LB_CONNS_TRACKED,    /* connected sockets recorded for destruction on backend removal */
	SL_LB_ERR_CONNS,        /* connected socket could not be recorded */
	SL_LB_EVENTS_LOST,      /* events dropped: the event ring was full */
	SL_LB_NAT_EVICTED,      /* a socket's least recently used translation dropped for another VIP */
	SL_LB_PICK_AMBIGUOUS,   /* UDP picks left ambiguous: every backend tried answers for another VIP of the socket */
	SL_LB_BANK_RETRY,       /* frontend re-read: an apply published new backends during the pick */
	SL_LB_QUOTA,            /* connected sockets not recorded: their owner holds its quota of sl_lb_conns */
	SL_LB_POL_DENIED_CONNECT, /* connects and sends refused by network policy (EPERM) */
	SL_LB_POL_DENIED_PACKET,  /* first packets of flows dropped by network policy (SYN, UDP) */
	SL_LB_POL_FIRST_PACKET,   /* first packets of flows into isolated pods judged */
	SL_LB_POL_FLOW_HITS,      /* UDP datagrams judged by a cached flow verdict */
	SL_LB_POL_REPLIES,        /* UDP replies let in to an unconnected sender */
	SL_LB_AFFINITY_QUOTA,     /* affinity not recorded: the owner holds its quota of sl_svc_affinity, or it is full */
	SL_LB_OUT_OF_SCOPE,       /* connects and sends to a service address left untranslated: host-only mode, or an opted-out pod */
	SL_LB_POL_REPLIES_SPILLED, /* UDP exchanges moved out of a full socket table to its overflow table (sl_pol_replies_more) */
	SL_LB_POL_REPLIES_QUOTA,   /* UDP exchanges not recorded: their socket's owner holds its quota of exchange tables */
	SL_LB_MAX,
};

struct sl_lb_counters {
	__u64 c[SL_LB_MAX];
};

#endif
