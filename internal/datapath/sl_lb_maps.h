/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: maps of the service load balancer, and the owners' holdings
 * of them (and of the policy's UDP exchange tables). */
#ifndef SL_LB_MAPS_H
#define SL_LB_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "sl_consts.h"
#include "sl_lb_structs.h"
#include "sl_quota.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_MAX_FRONTENDS);
	__type(key, struct sl_svc_key);
	__type(value, struct sl_svc_val);
} sl_svc SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_MAX_BACKEND_SLOTS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sl_backend_key);
	__type(value, struct sl_backend);
} sl_svc_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_MAX_BACKEND_SLOTS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sl_member_key);
	__type(value, struct sl_member);
} sl_svc_members SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_MAX_MAGLEV);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sl_maglev_key);
	__type(value, struct sl_maglev);
} sl_svc_maglev SEC(".maps");

/* Selections per frontend and backend (same key as sl_svc_members).
 * Shared counters, added to atomically: per-CPU hash elements cost tens
 * of microseconds each to allocate and free, which made programming
 * 10,000 services take seconds. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_MAX_BACKEND_SLOTS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sl_member_key);
	__type(value, __u64);
} sl_svc_selected SEC(".maps");

/* Connects and sends refused per frontend id (no backend); shared. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_MAX_FRONTENDS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, __u64);
} sl_svc_refused SEC(".maps");

/* ClientIP affinity. Not an LRU: nobody's entries push out another's.
 * Expired entries are replaced in place by their next use, and removed by
 * the agent (sl_lb_affinity_expire) when unused. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_MAX_AFFINITY);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sl_affinity_key);
	__type(value, struct sl_affinity);
} sl_svc_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sl_lb_sock);
} sl_lb_sk SEC(".maps");

/* Translated connected sockets by cookie. An entry leaves when its socket
 * is released (sl_sock_release); nothing evicts one, since a TCP socket's
 * getpeername answers from it. Entries of sockets that closed while their
 * cgroup was detached are pruned by the agent (PruneTrackedSockets). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_MAX_LB_CONNS);
	__type(key, __u64);
	__type(value, struct sl_lb_conn);
} sl_lb_conns SEC(".maps");

/* Network namespaces (cookies) whose sockets the load balancer leaves
 * alone: pods opted out (a service mesh's), whose connects to service
 * addresses the node's per-packet proxy serves. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_MAX_OWNERS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u64);
	__type(value, __u32);
} sl_lb_optout SEC(".maps");

/* Per-owner holdings of sl_lb_conns (SL_OWNER_LB_CONNS each). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_MAX_OWNERS);
	__type(key, __u64);
	__type(value, struct sl_lb_owner);
} sl_lb_owners SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sl_lb_counters);
} sl_lb_stats SEC(".maps");

/* Counts one event of the load balancer (or the policy) on this CPU. */
static __always_inline void lb_count(enum sl_lb_counter c)
{
	__u32 zero = 0;
	struct sl_lb_counters *cnt = bpf_map_lookup_elem(&sl_lb_stats, &zero);
	if (cnt && c < SL_LB_MAX)
		cnt->c[c]++;
}

/* The owner's holdings, made if it has none yet. */
static __always_inline struct sl_lb_owner *lb_owner(__u64 owner)
{
	struct sl_lb_owner *o = bpf_map_lookup_elem(&sl_lb_owners, &owner);
	if (o)
		return o;
	struct sl_lb_owner zero = {};
	bpf_map_update_elem(&sl_lb_owners, &owner, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&sl_lb_owners, &owner);
}

/* Returns one entry of a table charged to owner (its count at held). */
static __always_inline void owner_release(__u64 *held)
{
	quota_return(held, 1);
}

/* Returns one sl_lb_conns entry charged to owner. */
static __always_inline void lb_owner_release(__u64 owner)
{
	struct sl_lb_owner *o = bpf_map_lookup_elem(&sl_lb_owners, &owner);
	if (o)
		owner_release(&o->conns);
}

#endif
