/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: --reader-verdict late. Every connection joins sl_sockmap_plain,
 * whose reads take the kernel's plain receive path, as the bare redirect's;
 * a reader whose writer finds it behind gets the valve's verdict then, from
 * the kernel. sk_msg may not add a socket to a socket map, nor may sock_ops
 * outside its ESTABLISHED and LISTEN callbacks; a tc program may, and so
 * may a bpf_timer callback that belongs to one. sl_late_arm, run once by
 * the loader (BPF_PROG_TEST_RUN), sets the callback of SL_LATE_TIMERS
 * timers; sl_msg queues the reader once and starts its CPU's timer
 * (late_ask); the callback adds each queued reader to sl_sockmap_late,
 * which carries sl_skb only (late_join). Until the connection records the
 * join (sl_conn.late_joined), the writer redirects under the backlog rule,
 * which moves the direction to TCP only after SL_BACKLOG_GRACE or at twice
 * the limit; the join takes microseconds. internal/sockbugs'
 * TestLateVerdictFromTimer shows the kernel doing this on 6.1, 6.12, 6.18. */
#ifndef SL_LATE_H
#define SL_LATE_H

#include "sl_conn.h"

#define SL_CLOCK_MONOTONIC 1
/* bpf_timer_init's answer for a timer set up already (by an earlier load
 * of the same pins). */
#define SL_EBUSY 16

/* Queues st's peer (peer_role) for the valve's verdict, once. Called by
 * the writer's sl_msg when it finds its reader behind by
 * SL_LATE_ASK_BYTES or half its budget of messages (backlog_read), or its
 * owner's quota of messages refusing a send (late_quota). A subprogram:
 * inlined at both, it added 4k instructions to sl_msg's verification. */
static __noinline void late_ask(struct sl_sock *st, __u32 peer_role)
{
	struct sl_conn *c = conn_of(st->slot);
	if (!c || word_gen(c->word) != st->gen || c->late_asked[peer_role & 1])
		return;
	c->late_asked[peer_role & 1] = SL_ASK_PENDING;
	__u64 v = (__u64)st->gen << 32 | sock_id(st->slot, peer_role);
	if (bpf_map_push_elem(&sl_late_queue, &v, 0)) {
		c->late_asked[peer_role & 1] = SL_ASK_REFUSED;
		count(SL_C_ERR_LATE_VERDICT, 1);
		return;
	}
	__u32 cpu = bpf_get_smp_processor_id() % SL_LATE_TIMERS;
	struct sl_late_timer *t = bpf_map_lookup_elem(&sl_late_timers, &cpu);
	if (t)
		bpf_timer_start(&t->timer, 0, 0);
}

/* Gives the reader under id (of slot generation gen) the valve's verdict:
 * it joins sl_sockmap_late under the same key, if it is still that slot's
 * member in sl_sockmap_plain. Returns 0 if it joined, 1 if its direction
 * moved to TCP meanwhile (the backlog rule: nothing for the valve to do),
 * -1 if it could not be given. The verdict then would see TCP's bytes
 * from the middle: a segment the reader began reading on the plain path
 * would reach it whole, its read head a second time. */
static __always_inline int late_join_one(__u32 id, __u32 gen)
{
	if (id >= SL_MAX_SOCKS)
		return -1;
	__u32 slot = id >> 1, role = id & 1;
	struct sl_conn *c = conn_of(slot);
	if (!c || word_gen(c->word) != gen)
		return -1;
	if (c->path[role ^ 1] == SL_PATH_TCP)
		return 1;
	struct bpf_sock *sk = bpf_map_lookup_elem(&sl_sockmap_plain, &id);
	if (!sk)
		return -1;
	int err = -1;
	struct sl_sock *st = bpf_sk_storage_get(&sl_sk_state, sk, 0, 0);
	if (st && st->gen == gen && st->slot == slot && !bpf_map_update_elem(&sl_sockmap_late, &id, sk, BPF_NOEXIST))
		err = 0;
	/* It left the plain map meanwhile (sock_leave takes it out of both,
	 * but may have run before the join): out of this one too. */
	struct bpf_sock *again = bpf_map_lookup_elem(&sl_sockmap_plain, &id);
	if (!err && again != sk) {
		bpf_map_delete_elem(&sl_sockmap_late, &id);
		err = -1;
	}
	if (again)
		bpf_sk_release(again);
	bpf_sk_release(sk);
	if (!err && st) {
		st->late = 1;
		c->late_joined[role] = 1;
	}
	if (err)
		c->late_asked[role] = SL_ASK_REFUSED;
	return err;
}

/* For a writer st past its owner's quota of messages, whose reader
 * (peer_role) was not in the valve's map when its send was looked at:
 * asks for the reader's late verdict, and returns whether the writer may
 * still redirect the send (without a window): the join is pending, or
 * done already (the timer's callback may run as soon as late_ask starts
 * it, before this returns; the valve then takes the next send). Never
 * where it was refused: the direction then moves to TCP, its reader in
 * the plain map, where TCP's window bounds what it holds. A reader in
 * the valve's map must not see its direction move to TCP: TCP's 1-byte
 * segments would pass its verdict one message each, past any window. A
 * subprogram, as late_ask: sl_msg's states stay as they are. */
static __noinline int late_quota(struct sl_sock *st, __u32 peer_role)
{
	if (!st)
		return 0;
	late_ask(st, peer_role);
	struct sl_conn *c = conn_of(st->slot);
	return c && word_gen(c->word) == st->gen && c->late_asked[peer_role & 1] == SL_ASK_PENDING;
}

#endif /* SL_LATE_H */
