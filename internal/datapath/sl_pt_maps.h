/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: maps of port virtualization. The agent writes the rules
 * (sl_pt_cgroups, sl_pt_vports, sl_pt_vindex, sl_pt_pool, sl_pt_addrs,
 * sl_pt_stats entries); the programs alone write sl_pt_claims and
 * sl_pt_binds, so that live mappings survive an agent restart and any
 * number of applies. */
#ifndef SL_PT_MAPS_H
#define SL_PT_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "sl_pt_structs.h"

/* cgroup id -> workload id. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_PT_MAX_CGROUPS);
	__type(key, __u64);
	__type(value, __u32);
} sl_pt_cgroups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sl_pt_levels);
} sl_pt_cglevels SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_PT_MAX_VPORTS);
	__type(key, struct sl_pt_vkey);
	__type(value, struct sl_pt_rule);
} sl_pt_vports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_PT_MAX_VPORTS);
	__type(key, struct sl_pt_pkey);
	__type(value, struct sl_pt_index);
} sl_pt_vindex SEC(".maps");

/* Every pool's ports, one bit each (port p: bit p % 64 of word p / 64). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u64);
} sl_pt_pool SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_PT_MAX_CLAIMS);
	__type(key, struct sl_pt_pkey);
	__type(value, struct sl_pt_claim);
} sl_pt_claims SEC(".maps");

/* (workload, protocol, virtual port) -> the real port its sockets hold;
 * or, written at apply, the virtual port itself for a program of the
 * workload that listened on it before its rule existed. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_PT_MAX_VPORTS);
	__type(key, struct sl_pt_vkey);
	__type(value, __u32);
} sl_pt_binds SEC(".maps");

/* Addresses of the node (value 0): a connect to one of them (or to
 * loopback, or to the unspecified address) is a connect to this node's
 * ports; and workloads' own addresses (value: the workload id), which
 * reach that workload's copy from anywhere. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_PT_MAX_ADDRS);
	__type(key, struct sl_pt_addr);
	__type(value, __u32);
} sl_pt_addrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sl_pt_sock);
} sl_pt_sk SEC(".maps");

/* Per workload, shared, added to atomically. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_PT_MAX_WORKLOADS + 1);
	__type(key, __u32);
	__type(value, struct sl_pt_count);
} sl_pt_stats SEC(".maps");

static __always_inline void pt_count(__u32 wl, enum sl_pt_counter c)
{
	struct sl_pt_count *n = bpf_map_lookup_elem(&sl_pt_stats, &wl);
	if (n && c < SL_PT_C_MAX)
		__sync_fetch_and_add(&n->c[c], 1);
}

#endif
