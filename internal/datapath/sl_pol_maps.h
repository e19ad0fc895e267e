/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: maps of the network policy, filled by the agent only (the UDP
 * flow cache aside: an LRU, so that a pod filling it only costs others a
 * fresh evaluation; and each UDP socket's exchanges, in its own storage). */
#ifndef SL_POL_MAPS_H
#define SL_POL_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "sl_pol_structs.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sl_pol_live);
} sl_pol_ctl SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, SL_POL_MAX_IPS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sl_pol_ip_key);
	__type(value, struct sl_pol_peer);
} sl_pol_ips SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_POL_MAX_CGROUPS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sl_pol_cgroup_key);
	__type(value, struct sl_pol_peer);
} sl_pol_cgroups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, SL_POL_MAX_RULES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sl_pol_rule_key);
	__type(value, struct sl_pol_rule);
} sl_pol_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SL_POL_MAX_POLICIES);
	__type(key, __u32);
	__type(value, struct sl_pol_count);
} sl_pol_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SL_POL_MAX_FLOWS);
	__type(key, struct sl_pol_flow_key);
	__type(value, struct sl_pol_flow);
} sl_pol_flows SEC(".maps");

/* Each unconnected UDP socket's exchanges, in its own storage: bounded
 * per socket, so no pod can push out another's. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sl_pol_replies);
} sl_pol_replies SEC(".maps");

/* Each socket's overflow of sl_pol_replies, made at its first overflow:
 * a socket's exchanges compete with its own only. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sl_pol_replies_more);
} sl_pol_replies_more SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_POD_MAX_RECORDS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct sl_pod_key);
	__type(value, struct sl_pod_record);
} sl_pod_records SEC(".maps");

#endif
