/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: data structures of the network policy, shared with Go through
 * BTF. The agent compiles Kubernetes NetworkPolicy into these tables (see
 * internal/policy); the programs only look them up.
 *
 * Every table is written in two banks: an apply fills the bank that is
 * not live, then publishes it by one update of sl_pol_ctl. A program
 * reads the live bank once and does all its lookups in it. */
#ifndef SL_POL_STRUCTS_H
#define SL_POL_STRUCTS_H

#include <linux/types.h>

enum sl_pol_limits {
	SL_POL_MAX_IPS = 131072,      /* address entries, both banks */
	SL_POL_MAX_RULES = 1048576,   /* rule entries, both banks */
	SL_POL_MAX_CGROUPS = 16384,   /* local endpoint cgroups, both banks */
	SL_POL_MAX_POLICIES = 65536,  /* policy ids (counters) */
	SL_POL_MAX_FLOWS = 65536,     /* cached verdicts of UDP flows */
	SL_POL_SOCK_REPLIES = 128,    /* exchanges an unconnected UDP socket keeps (a power of two) */
	SL_POL_REPLY_PROBES = 4,      /* slots a peer may take in its socket's table (a power of two) */
	SL_POL_SOCK_MORE = 256,       /* exchanges a socket's overflow table keeps (a power of two) */
	SL_POL_MORE_PROBES = 8,       /* slots a peer may take in a socket's overflow table (a power of two) */
	SL_POL_MORE_CHARGE = 2,       /* tables an overflow table counts for its owner's quota (twice the size) */
	SL_POL_CGROUP_DEPTH = 16,     /* ancestor levels searched for a pod's cgroup */
};

/* Reserved peer classes and identities. */
enum sl_pol_class {
	SL_POL_CLASS_WORLD = 0,       /* an address nothing names */
	SL_POL_CLASS_ANY = 0xffffffff, /* a rule that allows every peer */
};

/* Reserved identities; pods' start at SL_POL_IDENTITY_PODS. */
enum sl_pol_identity {
	SL_POL_IDENTITY_WORLD = 0,
	SL_POL_IDENTITY_HOST = 1,     /* this node: always let in (as Kubernetes has it) */
	SL_POL_IDENTITY_PODS = 256,
};

enum sl_pol_dir {
	SL_POL_INGRESS = 0,
	SL_POL_EGRESS = 1,
};

enum sl_pol_flag {
	SL_POL_ISOLATED_INGRESS = 1,
	SL_POL_ISOLATED_EGRESS = 2,
};

/* The live bank, and whether any policy is programmed at all (none: every
 * hook leaves at its first lookup). */
struct sl_pol_live {
	__u32 bank;
	__u32 enabled;
	__u64 generation;             /* applies so far: cached UDP verdicts of another are stale */
	__u32 dirty;                  /* the other bank still holds entries (cleared after a publish) */
	__u32 pad;
};

/* An address or prefix (IPv6, or IPv4-mapped, network order) in a bank.
 * prefixlen counts the bank's 32 bits. */
struct sl_pol_ip_key {
	__u32 prefixlen;
	__u32 bank;
	__u32 ip[4];
};

/* What an address (or a local pod's cgroup) is to the policy. */
struct sl_pol_peer {
	__u32 class;                  /* peer class: identity, the ipBlocks holding it, its named ports */
	__u32 class6;                 /* cgroup entries: the class of the pod's IPv6 address */
	__u32 identity;               /* numeric identity of (namespace, its labels, pod labels); 0 world, 1 host */
	__u32 ep;                     /* local endpoint id (a pod on this node), 0 if none */
	__u32 flags;                  /* enum sl_pol_flag of the endpoint */
	__u32 policy[2];              /* a policy isolating the endpoint, by enum sl_pol_dir (for reports) */
	__u32 pad;
};

/* A local pod's cgroup in a bank. */
struct sl_pol_cgroup_key {
	__u64 cgroup;
	__u32 bank;
	__u32 pad;
};

/* An allow rule of a local endpoint for one direction: peers of a class
 * (or every peer: SL_POL_CLASS_ANY), then a protocol (prefix through it),
 * then a port prefix (port in network order). prefixlen counts the bits
 * from bank on: SL_POL_RULE_ALL_BITS allows every protocol and port. */
struct sl_pol_rule_key {
	__u32 prefixlen;
	__u32 bank;
	__u32 ep;
	__u32 dir;
	__u32 class;
	__u8 proto;
	__u8 port[2];
	__u8 pad;
};

enum sl_pol_rule_bits {
	SL_POL_RULE_ALL_BITS = 128,   /* bank, ep, dir, class */
	SL_POL_RULE_PROTO_BITS = 136, /* and the protocol */
	SL_POL_RULE_PORT_BITS = 152,  /* and the whole port */
};

/* The policy whose rule matched (allows are counted to it). */
struct sl_pol_rule {
	__u32 policy;
	__u32 pad;
};

/* Verdicts per policy id, shared (added to atomically). */
struct sl_pol_count {
	__u64 allowed;
	__u64 denied;
};

/* A UDP flow into a local pod seen at its first datagram. */
struct sl_pol_flow_key {
	__u32 src[4];
	__u32 dst[4];
	__u16 sport;
	__u16 dport;
	__u32 pad;
};

struct sl_pol_flow {
	__u64 generation;
	__u32 allow;
	__u32 pad;
};

/* An unconnected UDP socket's exchanges (sl_pol_replies, the socket's own
 * storage): the peers it sent to, or let a datagram in from, under a
 * policy generation; answers from there are part of a flow already
 * judged. A small open-addressed table per socket, which nothing another
 * socket does can empty; a socket with more live exchanges than its table
 * holds moves some to an overflow table of its own (sl_pol_replies_more),
 * made at its first overflow. Both are charged to the socket's owner
 * (owner_udp_tables) and returned when the socket closes. */
struct sl_pol_reply_peer {
	__u32 ip[4];
	__u16 port;
	__u16 pad;
	__u32 generation;             /* the low 32 bits of sl_pol_live.generation (0: empty) */
};

struct sl_pol_replies {
	__u32 spilled;                /* the generation (low 32 bits) under which this socket last spilled (0: never) */
	__u32 charged;                /* tables charged to owner for this socket: 1, 3 with its overflow table */
	__u64 owner;                  /* the cgroup id charged (owner_udp_tables) */
	struct sl_pol_reply_peer peers[SL_POL_SOCK_REPLIES];
};

/* A socket's overflow table: exchanges moved out of its full table
 * (sl_pol_replies), found the same way with more probes. */
struct sl_pol_replies_more {
	struct sl_pol_reply_peer peers[SL_POL_SOCK_MORE];
};

/* The pod table: what this node says of its pods to the other nodes'
 * policies (each node publishes its own; the state sync replicates the
 * table, so an agent need not watch every pod of the cluster). Only the
 * agent reads and writes it; no program looks it up. */
enum sl_pod_limits {
	SL_POD_MAX_RECORDS = 65536,   /* pod addresses of the cluster */
	SL_POD_RECORD_DATA = 1532,    /* an encoded record (socklane.sync.v1.PodRecord) */
};

/* A pod address (IPv6, or IPv4-mapped, network order). */
struct sl_pod_key {
	__u8 addr[16];
};

struct sl_pod_record {
	__u32 len;                    /* bytes of data used */
	__u8 data[SL_POD_RECORD_DATA];
};

#endif
