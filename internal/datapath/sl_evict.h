/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: leaving the map. A socket whose incoming direction moved to TCP
 * leaves once what was redirected to it is read; a timer (sl_evict_timers,
 * charged to the connection's owner) checks while it waits. And what a
 * closing socket used of its open verdict window. */
#ifndef SL_EVICT_H
#define SL_EVICT_H

#include "sl_conn.h"

/* A socket closing under an open verdict window: what the kernel used of
 * the window (the psock's apply_bytes counts down) was redirected and is
 * counted now, so that a closed connection's byte totals are exact. Runs
 * at release, before the sockmap's close detaches the psock. */
static __always_inline void credit_window(struct sl_sock *st, struct sl_conn *c, struct sock *sk)
{
	if (!st->win_left)
		return;
	struct sk_psock *ps = psock_of(sk);
	if (ps) {
		__u32 left = 0;
		bpf_core_read(&left, sizeof(left), &ps->apply_bytes);
		if (left <= st->win_left) {
			__u64 used = st->win_left - left;
			c->bytes[st->role & 1] += used;
			count(SL_C_REDIRECT_BYTES, used);
		}
	}
	st->win_left = 0;
}

/* Counts what sk's TCP took since the open valve last passed one of its
 * sends (st->valve_mark): a send is counted from TCP's write_seq, not
 * from what sl_msg saw, because the kernel passes the next send without
 * running sl_msg after a pass whose push failed (a non-blocking writer's
 * EAGAIN leaves the pass verdict standing), and a failed push takes less
 * than the send. Runs at the next sl_msg run and at the close. */
static __always_inline void valve_credit(struct sl_sock *st, struct sl_conn *c, struct sock *sk, __u32 state)
{
	if (!st->valve_mark || !sk)
		return;
	__u32 seq = 0;
	bpf_core_read(&seq, sizeof(seq), &((struct tcp_sock *)sk)->write_seq);
	__u32 n = seq - st->valve_seq;
	/* A socket in state (the one it closes from) that sent its FIN: the
	 * FIN took a sequence number, not a byte. */
	if (n && (state == BPF_TCP_FIN_WAIT1 || state == BPF_TCP_FIN_WAIT2 || state == BPF_TCP_TIME_WAIT ||
		  state == BPF_TCP_LAST_ACK || state == BPF_TCP_CLOSING))
		n--;
	st->valve_mark = 0;
	c->tcp_bytes[st->role & 1] += n;
	count(SL_C_PASS_BYTES, n);
	count(SL_C_VALVE_BYTES, n);
}

/* Deletes a waiting socket's timer entry (key id, value v) and returns the
 * timer to its owner; only the deleter that wins returns it, and gets 1. */
static __always_inline int evict_timer_drop(__u32 *id, struct sl_evict_timer *v)
{
	__u64 owner = v->owner;
	if (bpf_map_delete_elem(&sl_evict_timers, id))
		return 0;
	owner_release(owner, SL_HOLD_EVICT_TIMERS);
	return 1;
}

/* Ends the membership a closed socket kept while its timer (key id, of
 * slot generation gen) checked it (linger_start). Called by whoever
 * deleted that timer, and at the socket's close(); a second call, or one
 * after the slot moved on to another generation, changes nothing. */
static __always_inline void linger_leave(__u32 id, __u32 gen)
{
	__u32 slot = id >> 1, role = id & 1;
	struct sl_conn *c = conn_of(slot);
	if (!c)
		return;
	if (word_gen(c->word) == gen)
		clear_member_sock(slot, role);
	conn_leave(c, slot, gen, role);
}

/* Whether the socket of (slot, role), whose incoming direction moved to
 * TCP, may leave the map: what was redirected to it is read, and its peer
 * can no longer redirect to it (a redirect to a socket that left the map
 * fails with EPIPE). */
static __always_inline int may_leave(__u32 slot, __u32 role, struct sock *self)
{
	return !queued_bytes(self) && !peer_may_redirect(member_sock(slot, role ^ 1));
}

/* The timer of a socket waiting to leave the map (key: its key in
 * sl_sockmap_plain: a socket of the valve's map has none, evict_later):
 * takes it out once it may leave, else checks again later (SL_EVICT_* in
 * sl_consts.h). A slot of another generation (its sockets closed, the slot
 * reused or reclaimed) or a closed member ends it. A lingering member
 * (linger_start) leaves its slot as this ends, unless it is still in the
 * map at the deadline: it then stays a member until its close(). */
static int evict_check(void *map, __u32 *key, struct sl_evict_timer *v)
{
	__u32 id = *key;
	__u32 slot = id >> 1, role = id & 1;
	struct sl_conn *c = conn_of(slot);
	struct sock *self = member_sock(slot, role);
	int stays = 0;
	if (!c || word_gen(c->word) != v->gen || !self)
		goto done;
	if (!may_leave(slot, role, self)) {
		/* Given up: a lingering socket, still in the map, keeps its
		 * slot until its close() (linger_start). */
		if (bpf_ktime_get_ns() >= v->until_ns) {
			stays = 1;
			goto done;
		}
		__u32 shift = v->tries / SL_EVICT_STEP;
		if (shift > SL_EVICT_MAX_SHIFT)
			shift = SL_EVICT_MAX_SHIFT;
		v->tries++;
		bpf_timer_start(&v->timer, SL_EVICT_CHECK_NS << shift, 0);
		return 0;
	}
	/* Again just before the delete: a close, the slot's reuse and a new
	 * handshake during the checks above would have put a newer socket
	 * under this key. (Comparing the entry itself needs a referenced
	 * lookup, and sock_ops has no bpf_sk_release to drop it.) */
	if (word_gen(c->word) != v->gen || member_sock(slot, role) != self)
		goto done;
	if (late_on())
		bpf_map_delete_elem(&sl_sockmap_late, &id);
	if (!bpf_map_delete_elem(&sl_sockmap_plain, &id))
		count(SL_C_EVICTIONS, 1);
done:;
	__u32 gen = v->gen, linger = v->linger && !stays;
	if (evict_timer_drop(key, v) && linger)
		linger_leave(id, gen);
	return 0;
}

/* Has a timer check st's socket until it may leave the map: a reader that
 * sizes its reads by FIONREAD sees 0 for the bytes TCP queues to a socket
 * still in the map, and may wait for them without transmitting anything.
 * The timer is charged to the connection's owner (the client's, as its
 * slot), within owner_evict_timers: each checks up to 1,000 times a
 * second in softirq, charged to no process, so a pod whose connections
 * keep thousands of sockets waiting would have the node spend CPU for it.
 * Beyond the quota a socket is checked at its own transmits only.
 * Never in the valve's map (valve_on): its sk_skb verdict puts TCP's bytes in the psock
 * queue too, where FIONREAD counts them, and it does so under the
 * socket's lock, which a timer does not hold. A timer that found the
 * queue empty could delete the socket just after a segment joined it,
 * and leaving the map drops that queue. The socket's own transmits (its
 * ACKs, the window updates its reads send, its sends) run under the lock
 * and take it out. */
static __always_inline void evict_later(struct sl_sock *st, struct sl_conn *c)
{
	if (valve_on())
		return;
	__u32 id = st->self_id;
	struct sl_evict_timer *v = bpf_map_lookup_elem(&sl_evict_timers, &id);
	if (v && v->gen == st->gen) {
		v->tries = 0; /* armed; its next checks come soon again */
		return;
	}
	if (v)
		evict_timer_drop(&id, v); /* a closed socket's, of this slot */
	__u64 owner = c->owner;
	if (!owner_charge(owner, SL_HOLD_EVICT_TIMERS)) {
		count(SL_C_EVICT_TIMER_QUOTA, 1);
		return;
	}
	struct sl_evict_timer init = {.gen = st->gen, .until_ns = bpf_ktime_get_ns() + SL_EVICT_FOR_NS, .owner = owner};
	if (bpf_map_update_elem(&sl_evict_timers, &id, &init, BPF_NOEXIST)) {
		owner_release(owner, SL_HOLD_EVICT_TIMERS); /* armed just now, or out of memory */
		return;
	}
	v = bpf_map_lookup_elem(&sl_evict_timers, &id);
	if (!v)
		return; /* deleted at once: its deleter returned the charge */
	if (bpf_timer_init(&v->timer, &sl_evict_timers, SL_CLOCK_MONOTONIC) ||
	    bpf_timer_set_callback(&v->timer, evict_check) || bpf_timer_start(&v->timer, SL_EVICT_CHECK_NS, 0))
		evict_timer_drop(&id, v);
}

/* A socket that reaches CLOSE before its close() (its peer's reset, or its
 * peer's FIN after its own shutdown) stays in its socket map until its
 * file is closed (no kernel tested, Debian's 6.1 included, has a sockmap
 * unhash handler), under its key, which is its slot's. Its slot must not
 * go to another connection meanwhile: that connection's socket could not
 * join under the same key and would stay on TCP, so a pod holding such
 * sockets open would deny the bypass to whichever connections take its
 * slots next. So here,
 * while the psock is still attached (under the socket's lock; no segment
 * comes to a CLOSE socket):
 *  - if what was redirected to it is read, nothing waits for the psock's
 *    worker, and its peer can no longer redirect to it, it leaves the map
 *    now, and its slot is free to go;
 *  - else it lingers: it stays a member of its slot until its close()
 *    (sl_release, linger_end), so the slot, its key and its member pointer
 *    stay its own (the psock holds the socket while it is in the map). On
 *    the plain map with its incoming direction moved to TCP, FIONREAD
 *    counts only the psock's queue while it is in the map, never the bytes
 *    TCP holds behind it: its timer, armed now if it had none (within the
 *    owner's quota), takes it out once that queue is read and ends the
 *    linger then (evict_check).
 * Returns 1 if it lingers; the caller then keeps its membership. */
static __always_inline int linger_start(struct sl_sock *st, struct sl_conn *c, struct sock *sk)
{
	/* Out of the map already: its close() (the sockmap's close ran
	 * before this callback and detached the psock). */
	if (!st->in_map || !psock_of(sk))
		return 0;
	int moved = !valve_on() && c->path[(st->role ^ 1) & 1] == SL_PATH_TCP;
	if (may_leave(st->slot, st->role, sk) && !psock_skbs_waiting(sk)) {
		/* An eviction where its direction had moved to TCP (so that
		 * FIONREAD counts what TCP holds), as its timer's would be. */
		if (!sock_leave(st, st->self_id) && moved)
			count(SL_C_EVICTIONS, 1);
		st->in_map = 0;
		return 0;
	}
	/* Its close() ran already (sl_release, racing this softirq): the
	 * sockmap's close takes it out next, and nothing would end a
	 * linger. */
	if (__sync_val_compare_and_swap(&st->linger, SL_LINGER_NONE, SL_LINGER_ON) != SL_LINGER_NONE)
		return 0;
	count(SL_C_LINGERS, 1);
	if (!moved)
		return 1;
	evict_later(st, c);
	__u32 id = st->self_id;
	struct sl_evict_timer *v = bpf_map_lookup_elem(&sl_evict_timers, &id);
	if (v && v->gen == st->gen)
		v->linger = 1;
	return 1;
}

/* close() of a lingering socket (sl_release, before the sockmap's close
 * takes it out): its timer ends and it leaves its slot. It leaves even
 * when the timer is gone already: a timer check that took the socket out
 * between linger_start's arming and its marking ended without leaving. */
static __always_inline void linger_end(struct sl_sock *st)
{
	__u32 id = st->self_id;
	struct sl_evict_timer *v = bpf_map_lookup_elem(&sl_evict_timers, &id);
	if (v && v->gen == st->gen)
		evict_timer_drop(&id, v);
	linger_leave(id, st->gen);
}

#endif /* SL_EVICT_H */
