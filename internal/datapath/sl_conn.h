/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: the connection table. A connection is a slot in sl_conns whose
 * word holds generation, state and members; both sockets of a connection
 * find each other through it. */
#ifndef SL_CONN_H
#define SL_CONN_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "sl_consts.h"
#include "sl_structs.h"
#include "sl_maps.h"
#include "sl_event_maps.h"
#include "sl_kernel.h"
#include "sl_quota.h"

static __always_inline __u32 word_gen(__u64 w) { return w >> SL_WORD_GEN_SHIFT; }
static __always_inline __u32 word_state(__u64 w) { return (w >> SL_WORD_STATE_SHIFT) & SL_WORD_FIELD_MASK; }
static __always_inline __u32 word_members(__u64 w) { return w & SL_WORD_FIELD_MASK; }
static __always_inline __u64 mkword(__u32 gen, __u32 state, __u32 members)
{
	return ((__u64)gen << SL_WORD_GEN_SHIFT) | ((__u64)state << SL_WORD_STATE_SHIFT) | members;
}

static __always_inline struct sl_counters *counters(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&sl_stats, &zero);
}

static __always_inline void count(enum sl_counter c, __u64 n)
{
	struct sl_counters *cnt = counters();
	if (cnt && c < SL_C_MAX)
		cnt->c[c] += n;
}

static __always_inline void copy_ip(__u32 *dst, const __u32 *src)
{
	dst[0] = src[0];
	dst[1] = src[1];
	dst[2] = src[2];
	dst[3] = src[3];
}

/* Emits an event about connection c (src: the client, dst: the server)
 * if a reader listens. */
static __noinline void conn_event(struct sl_conn *c, __u32 type, __u32 reason, __u8 dir, __u8 role)
{
	int lost;
	struct sl_event *e = event_reserve(&lost);
	if (!e) {
		if (lost)
			count(SL_C_EVENTS_LOST, 1);
		return;
	}
	e->type = type;
	e->reason = reason;
	e->dir = dir;
	e->role = role;
	e->proto = 6; /* IPPROTO_TCP */
	e->netns = role == SL_ROLE_SERVER ? c->server_netns : c->client_netns;
	copy_ip(e->src_ip, c->client.local_ip);
	copy_ip(e->dst_ip, c->client.remote_ip);
	e->src_port = c->client.local_port;
	e->dst_port = c->client.remote_port;
	e->bytes[0] = c->bytes[0] + c->tcp_bytes[0];
	e->bytes[1] = c->bytes[1] + c->tcp_bytes[1];
	e->msgs[0] = c->msgs[0] + c->tcp_msgs[0];
	e->msgs[1] = c->msgs[1] + c->tcp_msgs[1];
	bpf_ringbuf_submit(e, 0);
}

static __always_inline __u32 sock_id(__u32 slot, __u32 role)
{
	return slot << 1 | role;
}

static __always_inline struct sock *member_sock(__u32 slot, __u32 role)
{
	struct sl_conn_socks *socks = bpf_map_lookup_elem(&sl_conn_socks, &slot);
	if (!socks)
		return 0;
	/* Two loads at constant offsets: the verifier refuses a kptr load at
	 * a computed one. */
	struct sock *sk;
	if (role == SL_ROLE_CLIENT) {
		sk = socks->client;
		asm volatile("" ::: "memory");
	} else {
		sk = socks->server;
	}
	return sk;
}

static __always_inline struct sl_conn *conn_of(__u32 slot)
{
	return bpf_map_lookup_elem(&sl_conns, &slot);
}

/* Moves the connection from PENDING to state (BYPASS or TCP), adding
 * add_member to its members. Returns the state the connection is in after
 * the attempt. */
static __always_inline __u32 conn_decide(struct sl_conn *c, __u32 gen, __u32 state, __u32 add_member)
{
	__u64 old = c->word;
	if (word_gen(old) != gen)
		return SL_CONN_FREE;
	if (word_state(old) != SL_CONN_PENDING)
		return word_state(old);
	__u64 new = mkword(gen, state, word_members(old) | add_member);
	__u64 seen = __sync_val_compare_and_swap(&c->word, old, new);
	if (seen == old)
		return state;
	/* Someone else moved it (members only change together with state, or
	 * on close): report what it is now. */
	if (word_gen(seen) != gen)
		return SL_CONN_FREE;
	return word_state(seen);
}

enum { SL_HOLD_CONNS, SL_HOLD_LISTENERS, SL_HOLD_EVICT_TIMERS };

/* The count of what an owner holds, its count of refusals and its quota. */
static __always_inline __u64 *owner_held(struct sl_owner *o, int what, __u64 **refused, __u64 *quota)
{
	if (what == SL_HOLD_CONNS) {
		*refused = &o->refused_conns;
		*quota = sl_settings.owner_conns;
		return &o->conns;
	}
	if (what == SL_HOLD_LISTENERS) {
		*refused = &o->refused_listeners;
		*quota = sl_settings.owner_listeners;
		return &o->listeners;
	}
	*refused = &o->refused_evict_timers;
	*quota = sl_settings.owner_evict_timers;
	return &o->evict_timers;
}

/* Charges owner one entry of a table, within its quota. Returns 0 (and
 * counts the refusal) when it holds its quota, or when the owners table is
 * full: a new owner then gets nothing rather than taking from others. */
static __always_inline int owner_charge(__u64 owner, int what)
{
	struct sl_owner *o = bpf_map_lookup_elem(&sl_owners, &owner);
	if (!o) {
		struct sl_owner zero = {};
		bpf_map_update_elem(&sl_owners, &owner, &zero, BPF_NOEXIST);
		o = bpf_map_lookup_elem(&sl_owners, &owner);
		if (!o)
			return 0;
	}
	__u64 *refused, quota;
	__u64 *n = owner_held(o, what, &refused, &quota);
	if (__sync_fetch_and_add(n, 1) < quota)
		return 1;
	__sync_fetch_and_add(n, -1);
	__sync_fetch_and_add(refused, 1);
	return 0;
}

/* Returns one entry charged to owner. */
static __always_inline void owner_release(__u64 owner, int what)
{
	struct sl_owner *o = bpf_map_lookup_elem(&sl_owners, &owner);
	if (!o)
		return;
	__u64 *refused, quota;
	quota_return(owner_held(o, what, &refused, &quota), 1);
}

/* Charges owner n messages within its quota of them (msgs_quota in
 * sl_verdict.h). Its entry exists: its connection's slot is charged to it. */
static __always_inline int owner_msgs_charge(__u64 owner, __u32 n)
{
	struct sl_owner *o = bpf_map_lookup_elem(&sl_owners, &owner);
	if (!o)
		return 0;
	if (__sync_fetch_and_add(&o->msgs, n) + n <= sl_settings.owner_msgs)
		return 1;
	__sync_fetch_and_add(&o->msgs, -(__u64)n);
	return 0;
}

/* Whether owner's quota of messages has room for a step (SL_MSG_CHUNK). */
static __always_inline int owner_msgs_room(__u64 owner)
{
	struct sl_owner *o = bpf_map_lookup_elem(&sl_owners, &owner);
	return o && o->msgs + SL_MSG_CHUNK <= sl_settings.owner_msgs;
}

/* Counts a send refused for owner's quota of messages. */
static __always_inline void owner_msgs_refused(__u64 owner)
{
	struct sl_owner *o = bpf_map_lookup_elem(&sl_owners, &owner);
	if (o)
		__sync_fetch_and_add(&o->refused_msgs, 1);
}

/* Returns n messages charged to owner, never below zero (as
 * owner_release). */
static __always_inline void owner_msgs_release(__u64 owner, __u32 n)
{
	struct sl_owner *o = n ? bpf_map_lookup_elem(&sl_owners, &owner) : 0;
	if (!o)
		return;
	quota_return(&o->msgs, n);
}

/* Takes a connection slot: a fresh one while any is left, else the one
 * freed longest ago. Returns non-zero when none is free. */
static __always_inline int conn_slot_take(__u32 *slot)
{
	__u32 zero = 0;
	__u64 *next = bpf_map_lookup_elem(&sl_conn_next, &zero);
	if (next && *next < SL_MAX_CONNS) {
		__u64 n = __sync_fetch_and_add(next, 1);
		if (n < SL_MAX_CONNS) {
			*slot = (__u32)n;
			return 0;
		}
	}
	return bpf_map_pop_elem(&sl_conn_free, slot);
}

/* Drops role's membership; the last member returns the slot. */
static __always_inline void conn_leave(struct sl_conn *c, __u32 slot, __u32 gen, __u32 role)
{
	__u32 bit = 1u << role;
	for (int i = 0; i < 4; i++) {
		__u64 old = c->word;
		if (word_gen(old) != gen || !(word_members(old) & bit))
			return;
		__u32 members = word_members(old) & ~bit;
		__u64 new = members ? mkword(gen, word_state(old), members)
				    : mkword(gen + 1, SL_CONN_FREE, 0);
		if (__sync_val_compare_and_swap(&c->word, old, new) == old) {
			if (!members) {
				/* Both sockets closed: their queues are gone. */
				owner_msgs_release(c->owner, c->msgs_charged[0] + c->msgs_charged[1]);
				owner_release(c->owner, SL_HOLD_CONNS);
				bpf_map_push_elem(&sl_conn_free, &slot, 0);
			}
			return;
		}
	}
}

static __always_inline void set_member_sock(struct bpf_sock *bsk, __u32 slot, __u32 role)
{
	struct sl_conn_socks *socks = bpf_map_lookup_elem(&sl_conn_socks, &slot);
	if (!socks)
		return;
	struct sock *sk = (struct sock *)bpf_skc_to_tcp_sock(bsk);
	if (role == SL_ROLE_CLIENT) {
		socks->server = 0;
		socks->client = sk;
	} else {
		socks->server = sk;
	}
}

/* Forgets the member socket of (slot, role): it closed, or its lingering
 * ended (linger_leave). */
static __always_inline void clear_member_sock(__u32 slot, __u32 role)
{
	struct sl_conn_socks *socks = bpf_map_lookup_elem(&sl_conn_socks, &slot);
	if (socks && role == SL_ROLE_CLIENT)
		socks->client = 0;
	else if (socks)
		socks->server = 0;
}

/* Whether connections join sl_sockmap, with the valve's verdict: loaded
 * with the valve and --reader-verdict join. Else they join
 * sl_sockmap_plain, where a reader gets the verdict late (late_on) or a
 * slow reader's direction moves to TCP. Every choice between the two maps
 * asks this: the settings alone decide, so it is a constant and the
 * verifier drops the other map's paths. */
static __always_inline int valve_on(void)
{
	return sl_settings.backlog_valve == SL_MODE_ON && sl_settings.late_verdict != SL_MODE_ON;
}

/* --reader-verdict late: every connection is in sl_sockmap_plain, and a
 * reader that fell behind joins sl_sockmap_late, the valve's verdict. */
static __always_inline int late_on(void)
{
	return sl_settings.backlog_valve == SL_MODE_ON && sl_settings.late_verdict == SL_MODE_ON;
}

/* Whether the valve may pass into c's member role: its map carries the
 * valve's verdict, or it was given it late. */
static __always_inline int valve_into(const struct sl_sock *st, const struct sl_conn *c, __u32 role)
{
	if (valve_on())
		return 1;
	return late_on() && c->late_joined[role & 1];
}

/* Redirects msg to the peer under socket id peer, in the map st's
 * connection joined. */
static __always_inline long sock_redirect(struct sk_msg_md *msg, const struct sl_sock *st, __u32 peer)
{
	if (valve_on())
		return bpf_msg_redirect_map(msg, &sl_sockmap, peer, BPF_F_INGRESS);
	return bpf_msg_redirect_map(msg, &sl_sockmap_plain, peer, BPF_F_INGRESS);
}

/* Takes the socket under key id (a member of st's connection) out of the
 * socket map its connection joined (valve_on); 0 if it was there. */
static __always_inline long sock_leave(const struct sl_sock *st, __u32 id)
{
	if (valve_on())
		return bpf_map_delete_elem(&sl_sockmap, &id);
	/* A reader given the verdict late leaves both (a miss costs a
	 * lookup in an array). */
	if (late_on())
		bpf_map_delete_elem(&sl_sockmap_late, &id);
	return bpf_map_delete_elem(&sl_sockmap_plain, &id);
}

#endif /* SL_CONN_H */
