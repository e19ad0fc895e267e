/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: structures of port virtualization (ports.c). Copies of one
 * program that binds a fixed port run side by side in one network
 * namespace: each copy's bind to a virtual port gets a real port of its
 * pool, getsockname shows the virtual port, and connects to a virtual
 * port reach the caller's own copy, or the copy a route names. */
#ifndef SL_PT_STRUCTS_H
#define SL_PT_STRUCTS_H

#include <linux/types.h>

enum sl_pt_limits {
	SL_PT_MAX_WORKLOADS = 4096, /* workload ids are 1..SL_PT_MAX_WORKLOADS */
	SL_PT_MAX_CGROUPS = 16384,  /* cgroups naming a workload */
	SL_PT_MAX_VPORTS = 65536,   /* (workload, protocol, virtual port) rules */
	SL_PT_MAX_CLAIMS = 65536,   /* real ports held or resting (both protocols) */
	SL_PT_MAX_POOL = 16384,     /* ports in one pool */
	SL_PT_CGROUP_DEPTH = 16,    /* ancestor levels searched for a workload's cgroup */
	SL_PT_MAX_ADDRS = 8192,     /* the node's own addresses and the workloads' */
	SL_PT_SHARE_TRIES = 4,
};

/* Per-workload counters (id 0: sockets of no workload). The Go side reads
 * the names from BTF. */
enum sl_pt_counter {
	SL_PT_C_BINDS = 0,      /* binds given a real port of the pool */
	SL_PT_C_SHARED,         /* binds given the real port the workload holds for the virtual one */
	SL_PT_C_EXHAUSTED,      /* binds refused: no free port in the pool (EADDRINUSE) */
	SL_PT_C_RELEASED,       /* real ports returned to the pool */
	SL_PT_C_CONNECTS,       /* connects and sends to the workload's own virtual port */
	SL_PT_C_ROUTED,         /* connects and sends from elsewhere routed to the workload (by a route or its address) */
	SL_PT_C_NOT_BOUND,      /* connects and sends refused (ECONNREFUSED): the copy they go to is not listening */
	SL_PT_C_FOREIGN_BIND,   /* binds refused: the real port is another workload's */
	SL_PT_C_DIRECT,         /* binds to a pool port outside virtualization, held so that no pool hands it out */
	SL_PT_C_MAX,
};

enum sl_pt_flag {
	SL_PT_F_EPHEMERAL = 1, /* a rule for port 0: binds to port 0 draw from the pool */
};

/* What socket storage records (sl_pt_sock.kind bits). */
enum sl_pt_kind {
	SL_PT_K_BOUND = 1,     /* holds a reference on the claim of real */
	SL_PT_K_PEER_ADDR = 2, /* connected or sent to peer_real through a workload's address, shown instead of loopback */
};

struct sl_pt_vkey {
	__u32 wl;
	__u16 port; /* virtual port, host order; 0: binds to port 0 */
	__u8 proto;
	__u8 pad;
};

struct sl_pt_rule {
	__u16 pool_lo; /* real ports pool_lo..pool_hi */
	__u16 pool_hi;
	__u32 reuse_ms; /* a released port rests this long before another bind gets it */
	__u32 flags;    /* enum sl_pt_flag */
	__u32 pad;
};

/* A port number and protocol: a real port's claim, or a virtual port's
 * index entry. */
struct sl_pt_pkey {
	__u16 port;
	__u8 proto;
	__u8 pad;
};

/* Present for every virtual port some workload has: connects and sends to
 * other ports leave after this one lookup. */
struct sl_pt_index {
	__u32 route; /* the workload that sockets of no workload (or another) reach; 0: none */
	__u32 pad;
};

/* A real port held by sockets of one workload (refs > 0), or resting
 * since freed_ns after the last of them closed. */
struct sl_pt_claim {
	__u64 cookie;   /* the first socket that bound it */
	__u64 since_ns; /* CLOCK_MONOTONIC */
	__u64 freed_ns; /* when the last socket closed, if the port rests; 0: free at once */
	__u64 netns;
	__u32 wl;   /* 0: a direct bind by a socket of no workload */
	__u32 refs; /* sockets bound to it */
	__u16 vport;
	__u8 family;
	__u8 direct; /* bound to the pool port itself, not virtualized */
	__u32 pad;
};

/* Socket storage, created only by a bind to a virtual or pool port and by
 * a connect or send to a workload's address. */
struct sl_pt_sock {
	__u64 cookie; /* the socket that holds the claim */
	__u32 wl;
	__u16 vport;
	__u16 real;
	__u16 peer_real;
	__u16 pad0;
	__u8 kind; /* enum sl_pt_kind bits */
	__u8 proto;
	__u16 pad;
	__u32 peer_addr[4]; /* the workload address asked for (IPv4 as ::ffff:a.b.c.d) */
};

struct sl_pt_count {
	__u64 c[SL_PT_C_MAX];
};

/* The levels of the hierarchy workload cgroups are at (root: 0): the
 * search for a caller's workload looks only there. */
struct sl_pt_levels {
	__u32 min;
	__u32 max;
};

struct sl_pt_addr {
	__u32 ip[4]; /* IPv4 as ::ffff:a.b.c.d */
};

#endif
