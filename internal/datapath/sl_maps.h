/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: maps of the bypass datapath. */
#ifndef SL_MAPS_H
#define SL_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "sl_consts.h"
#include "sl_structs.h"
#include "sl_event_structs.h"

/* Managed sockets, an array indexed by socket id (slot << 1 | role, below
 * SL_MAX_SOCKS): the per-message redirect reads one entry, with no hash
 * and no bucket walk (a SOCKHASH's lookup cost sl_msg about 100 ns a send:
 * docs/benchmarks.md, Socket maps as arrays); endpoint matching happens
 * once per connection in sl_conn_index. */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, SL_MAX_SOCKS);
	__type(key, __u32);
	__type(value, __u64);
} sl_sockmap SEC(".maps");

/* The same for connections that join without the valve's sk_skb verdict
 * (a datapath loaded with --slow-readers tcp, or with --reader-verdict
 * late, whose readers get it in sl_sockmap_late when they fall behind).
 * A map's programs are
 * fixed for a socket when it joins, and a verdict on its map puts every
 * read of the socket on the kernel's parser receive path; without it
 * reads take the plain one, as for TCP's own bytes. sl_msg runs on both;
 * a slow reader's direction here moves to TCP (the backlog rule) unless it
 * gets the verdict late. Keys are unique across the two maps: a
 * connection's members join one. */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, SL_MAX_SOCKS);
	__type(key, __u32);
	__type(value, __u64);
} sl_sockmap_plain SEC(".maps");

/* --reader-verdict late: readers of sl_sockmap_plain given the valve's
 * verdict later (late_join), under the same key; carries sl_skb only (a
 * map's programs must not repeat one the socket has: sl_msg). */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, SL_MAX_SOCKS);
	__type(key, __u32);
	__type(value, __u64);
} sl_sockmap_late SEC(".maps");

/* Readers waiting for the valve's verdict: socket id | slot generation
 * << 32, queued once per reader (sl_conn.late_asked), so never more than
 * one per socket. */
struct {
	__uint(type, BPF_MAP_TYPE_QUEUE);
	__uint(max_entries, SL_MAX_SOCKS);
	__type(value, __u64);
} sl_late_queue SEC(".maps");

/* The timers that run late_join, armed once at load (sl_late_arm). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SL_LATE_TIMERS);
	__type(key, __u32);
	__type(value, struct sl_late_timer);
} sl_late_timers SEC(".maps");

/* One entry: SL_LAYOUT_VERSION of the socklane that created the datapath.
 * Written by the loader, read by adopters, never by the programs. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, enum sl_layout_version);
} sl_layout SEC(".maps");

/* One entry: the sockmap bugs (enum sl_kernel_bug bits) found when the
 * datapath was created. Written by the loader, read by `status`. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, enum sl_kernel_bug);
} sl_kernel SEC(".maps");

/* Per-socket state. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sl_sock);
} sl_sk_state SEC(".maps");

/* Connection table: the source of `socklane conns`. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SL_MAX_CONNS);
	__type(key, __u32);
	__type(value, struct sl_conn);
} sl_conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SL_MAX_CONNS);
	__type(key, __u32);
	__type(value, struct sl_conn_socks);
} sl_conn_socks SEC(".maps");

/* Sockets whose incoming direction moved to TCP and that still hold
 * redirected bytes: a timer each, which takes them out of the map once
 * those are read, with no transmit of theirs needed (see on_transmit).
 * Room for every key of sl_sockmap, allocated as used: no pod can fill it
 * and leave another's sockets without a timer. A pod's share is bounded by
 * owner_evict_timers, charged to its connections' owner (evict_later). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_MAX_SOCKS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct sl_evict_timer);
} sl_evict_timers SEC(".maps");

/* Where the last TCP segment the valve's sk_skb verdict (sl_skb) passed to
 * a socket of the map ended, keyed by the socket's cookie (an sk_skb
 * program has no socket storage). Added by sl_skb, removed when the socket
 * closes (on_close) or its slot is reclaimed (sl_reclaim, with the member
 * cookies of struct sl_conn): only members of a slot join sl_sockmap and
 * a member keeps its slot until it closes, so the entries are at most two
 * per slot, and no pod can fill the map. Allocated as used. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_MAX_SOCKS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u64);
	__type(value, struct sl_skb_seq);
} sl_skb_seqs SEC(".maps");

/* Per CPU, the SYNs a listener of an attached cgroup answered last, so
 * that a client learns at its handshake's end that its server is on this
 * node (unpace in sl_valve_tcp.h; where and why in sl_establish.h). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sl_syn_ring);
} sl_syn_rings SEC(".maps");

/* Network namespaces (cookies) whose TCP stays out of the bypass: pods
 * opted out (`socklane bypass optout`, or the agent for pods labelled
 * socklane.io/bypass=off), whose programs read in ways a bypassed socket
 * cannot serve (splice(2): Go's io.Copy between two TCP connections).
 * Their connections, as client or server, stay on TCP. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_MAX_OWNERS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u64);
	__type(value, __u32);
} sl_bypass_optout SEC(".maps");

/* Connection slots never used yet are taken in order from this counter
 * (nothing is filled at load); slots freed since wait in sl_conn_free and
 * are taken only once the counter has passed SL_MAX_CONNS: a freed slot
 * rests as long as possible before reuse (its sockets may still be
 * leaving sl_sockmap under its keys). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} sl_conn_next SEC(".maps");

/* Freed connection slots, a FIFO queue. */
struct {
	__uint(type, BPF_MAP_TYPE_QUEUE);
	__uint(max_entries, SL_MAX_CONNS);
	__type(value, __u32);
} sl_conn_free SEC(".maps");

/* Client tuple -> slot: how an accepted socket finds its local peer. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_MAX_CONNS);
	__type(key, struct sl_tuple);
	__type(value, struct sl_conn_ref);
} sl_conn_index SEC(".maps");

/* Listeners of managed cgroups, recorded at listen(): read when a client
 * sends before its server socket was accepted. Not an LRU: one owner's
 * listeners must not evict another's (SL_OWNER_LISTENERS bounds each). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_MAX_LISTENERS);
	__type(key, struct sl_listener);
	__type(value, struct sl_listener_val);
} sl_listeners SEC(".maps");

/* Per-owner holdings (see SL_OWNER_*). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_MAX_OWNERS);
	__type(key, __u64);
	__type(value, struct sl_owner);
} sl_owners SEC(".maps");


/* Destinations whose recent connections were brief (see sl_consts.h). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SL_MAX_BRIEF);
	__type(key, struct sl_dest);
	__type(value, struct sl_dest_stat);
} sl_brief SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sl_counters);
} sl_stats SEC(".maps");

/* Where a process's signal handlers are read in one copy (sl_signals.h). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sl_sig_scratch);
} sl_sig_scratch SEC(".maps");

/* Captured payload of bypassed messages (`socklane capture`). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);
} sl_capture SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sl_capture_cfg);
} sl_cap_settings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sl_cap_bucket);
} sl_cap_tokens SEC(".maps");

#endif
