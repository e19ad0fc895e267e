/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: the event stream and the capture of bypassed payload, shared
 * by the bypass and the service load balancer and with Go through BTF.
 * Addresses are IPv6 or IPv4-mapped IPv6 in network order, ports in host
 * order. */
#ifndef SL_EVENT_STRUCTS_H
#define SL_EVENT_STRUCTS_H

#include <linux/types.h>

enum sl_event_type {
	SL_EV_ESTABLISHED = 1, /* a managed client connected (its server may be remote) */
	SL_EV_BYPASS = 2,      /* both ends of a node-local connection joined: bypassed */
	SL_EV_TCP = 3,         /* a node-local candidate connection was left on TCP (reason) */
	SL_EV_FALLBACK = 4,    /* a direction moved from the bypass to TCP (reason; dir 2: both) */
	SL_EV_CLOSED = 5,      /* a managed socket closed (role); its connection's totals */
	SL_EV_LB_SELECT = 6,   /* the load balancer sent src (the VIP) to dst (a backend) */
	SL_EV_LB_REFUSED = 7,  /* the load balancer refused src (the VIP): no backend */
	SL_EV_POLICY_DENIED = 8, /* network policy refused src -> dst (svc_id: the policy, dir: enum sl_pol_dir) */
	SL_EV_PORTS_EXHAUSTED = 9, /* a bind to virtual port dst_port found its pool empty (svc_id: the workload) */
};

/* One event. For connection events src is the client and dst the
 * server; for load balancer events src is the service address asked for
 * and dst the backend chosen. */
struct sl_event {
	__u64 ts_ns;       /* CLOCK_MONOTONIC */
	__u64 netns;       /* network namespace cookie of the socket */
	__u64 bytes[2];    /* closed: bytes client->server, server->client */
	__u64 msgs[2];
	__u32 src_ip[4];
	__u32 dst_ip[4];
	__u16 src_port;
	__u16 dst_port;
	__u32 type;        /* enum sl_event_type */
	__u32 reason;      /* enum sl_counter of a fallback or TCP decision */
	__u32 svc_id;      /* load balancer: frontend id; policy: policy id */
	__u8 dir;          /* fallback, tcp: enum sl_dir; policy: enum sl_pol_dir */
	__u8 role;         /* closed, established, bypass: enum sl_role */
	__u8 proto;        /* load balancer, policy: IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;
	__u32 src_identity; /* policy: identities of src and dst (0 world, 1 host) */
	__u32 dst_identity;
	__u32 pad2;
};

/* Whether events are emitted: while bpf_ktime_get_ns() < until_ns. The
 * reader renews it; a reader that dies stops the stream within seconds. */
struct sl_events_cfg {
	__u64 until_ns;
};

/* Capture sizes: a record's payload buffer (SL_CAP_SNAP_MAX - 1 bytes
 * kept at most, a power of two so that a mask bounds the copy). */
enum sl_cap_limits {
	SL_CAP_SNAP_MAX = 1024,
};

/* What to capture, set by `socklane capture`, renewed like events. */
struct sl_capture_cfg {
	__u64 until_ns;
	__u64 netns;       /* only connections with an end here; 0: any */
	__u32 port;        /* only connections with this port at an end; 0: any */
	__u32 snap;        /* payload bytes kept per message, <= SL_CAP_SNAP_MAX */
	__u32 rate;        /* messages per second per CPU; 0: unlimited */
	__u32 pad;
};

/* A captured message: the header, then caplen payload bytes. */
struct sl_cap_hdr {
	__u64 ts_ns;       /* CLOCK_MONOTONIC */
	__u64 offset;      /* stream offset of its first byte in its direction */
	__u32 src_ip[4];   /* the sender */
	__u32 dst_ip[4];
	__u16 src_port;
	__u16 dst_port;
	__u32 len;         /* message length */
	__u32 caplen;      /* payload bytes captured */
	__u32 slot;        /* connection identity: slot and generation */
	__u32 gen;
	__u8 dir;          /* 0 client->server, 1 server->client */
	__u8 pad[3];
};

struct sl_cap_rec {
	struct sl_cap_hdr h;
	__u8 data[SL_CAP_SNAP_MAX];
};

/* Per-CPU token bucket of the capture rate limit. */
struct sl_cap_bucket {
	__u64 last_ns;
	__u64 tokens;
};

#endif
