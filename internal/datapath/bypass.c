//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* socklane bypass datapath.
 *
 * sl_sockops puts both ends of a same-node TCP connection into a socket map
 * (sl_sockmap with the valve's verdict, or sl_sockmap_plain);
 * sl_msg redirects each send straight into the peer socket's receive queue.
 *
 * One path per direction: a direction starts on the bypass only if no byte
 * of it went through TCP, and once it leaves the bypass it never returns.
 * The receiver (tcp_bpf_recvmsg) drains redirected bytes before TCP's queue,
 * so "bypass first, then TCP" keeps order and "TCP, then bypass" never
 * happens.
 *
 * Who decides: the accepted (server) socket joins a pending connection at
 * PASSIVE_ESTABLISHED, after the client socket is already in the map; the
 * client's first send commits the client direction. A client whose peer never
 * joins (remote or unmanaged) leaves the map at its first send, so it pays no
 * per-message cost afterwards.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>
#include "sl_consts.h"
#include "sl_structs.h"
#include "sl_config_structs.h"

/* The load-time settings (struct sl_config, sl_config_structs.h). */
const volatile struct sl_config sl_settings = SL_SETTINGS_DEFAULT;

#include "sl_maps.h"
#include "sl_event_maps.h"
#include "sl_kernel.h"
#include "sl_signals.h"
#include "sl_conn.h"
#include "sl_brief.h"
#include "sl_capture.h"
#include "sl_tuple.h"
#include "sl_listener.h"
#include "sl_evict.h"
#include "sl_verdict.h"
#include "sl_redirect.h"
#include "sl_overlap.h"
#include "sl_valve_tcp.h"
#include "sl_establish.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Keeps the enums, and the records read from ring buffers, in BTF so that
 * the Go side gets them generated. */
struct sl_enums {
	enum sl_counter counter;
	enum sl_conn_state state;
	enum sl_path path;
	enum sl_role role;
	enum sl_event_type event_type;
	struct sl_event event;
	struct sl_cap_hdr cap_hdr;
	enum sl_quota quota;
	enum sl_dir dir;
	enum sl_word word;
	enum sl_defaults defaults;
	enum sl_window window;
	enum sl_msg_quota msg_quota;
	enum sl_cap_limits cap_limits;
	enum sl_mode mode;
	enum sl_signals signals;
	enum sl_sig_mask sig_mask;
	enum sl_late late;
};
const struct sl_enums *sl_enums_unused __attribute__((unused));

static __always_inline void on_listen(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	if (!sk)
		return;
	struct sock *lsk = (struct sock *)bpf_skc_to_tcp_sock(sk);
	/* listen() runs in the server's process: its file is there. */
	int b = sock_blocking(lsk);
	__u32 listened = b < 0 ? SL_ACCEPTED_UNKNOWN : b ? SL_ACCEPTED_BLOCKING : SL_ACCEPTED_NONBLOCKING;
	struct sl_listener l;
	listener_key(skops, &l);
	struct sl_listener_val *pv = bpf_map_lookup_elem(&sl_listeners, &l);
	if (!pv) {
		/* A new entry is charged to the listener's owner. */
		__u64 owner = sock_owner(lsk);
		if (!owner_charge(owner, SL_HOLD_LISTENERS)) {
			count(SL_C_LISTENER_QUOTA, 1);
			return;
		}
		struct sl_listener_val v = {.info = {.owner = owner}};
		if (bpf_map_update_elem(&sl_listeners, &l, &v, BPF_NOEXIST)) {
			owner_release(owner, SL_HOLD_LISTENERS);
			return;
		}
		pv = bpf_map_lookup_elem(&sl_listeners, &l);
		if (!pv)
			return;
	}
	pv->info.cookie = bpf_get_socket_cookie(skops);
	pv->info.listened = listened;
	pv->info.signals = sl_settings.bypass_blocking == SL_MODE_PROCESS ? process_signals() : SL_SIG_UNKNOWN;
	if (sl_settings.listener_kptr)
		pv->sk = lsk;
	pv->info.accepted = SL_ACCEPTED_UNKNOWN;
	set_flags(skops, BPF_SOCK_OPS_STATE_CB_FLAG, 0);
}

static __always_inline void on_listener_close(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	if (!sk)
		return;
	struct sl_listener l;
	listener_key(skops, &l);
	struct sl_listener_val *v = bpf_map_lookup_elem(&sl_listeners, &l);
	if (v && v->info.cookie == bpf_get_socket_cookie(skops)) {
		__u64 owner = v->info.owner;
		if (!bpf_map_delete_elem(&sl_listeners, &l))
			owner_release(owner, SL_HOLD_LISTENERS);
	}
}


static __always_inline void on_close(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	if (!sk)
		return;
	struct sl_sock *st = bpf_sk_storage_get(&sl_sk_state, sk, 0, 0);
	if (!st || st->slot == SL_NO_SLOT)
		return;
	struct sl_conn *c = conn_of(st->slot);
	int lingers = 0;
	if (c) {
		if (st->role == SL_ROLE_CLIENT) {
			struct sl_conn_ref *ref = bpf_map_lookup_elem(&sl_conn_index, &c->client);
			if (ref && ref->slot == st->slot && ref->gen == st->gen)
				bpf_map_delete_elem(&sl_conn_index, &c->client);
		}
		if (word_gen(c->word) == st->gen) {
			/* A socket that reaches CLOSE before its close() (it
			 * shut down its writes, then its peer's FIN came) gets
			 * here before sl_release: what it used of an open
			 * window is counted now, while the psock is still
			 * attached (linger_start below may take it out). */
			if (st->win_left)
				credit_window(st, c, (struct sock *)bpf_skc_to_tcp_sock(sk));
			if (st->valve_mark)
				valve_credit(st, c, (struct sock *)bpf_skc_to_tcp_sock(sk), skops->args[0]);
			if (sl_settings.bypass_brief != SL_MODE_ON && st->role == SL_ROLE_CLIENT)
				brief_note(c, word_state(c->word));
			conn_event(c, SL_EV_CLOSED, 0, 0, st->role);
			/* Closed before its close(), still in the map: it
			 * leaves the map now, or keeps its slot (lingers). */
			lingers = linger_start(st, c, (struct sock *)bpf_skc_to_tcp_sock(sk));
			if (!lingers)
				clear_member_sock(st->slot, st->role);
		}
		if (!lingers)
			conn_leave(c, st->slot, st->gen, st->role);
	}
	/* A timer waiting for this socket to leave the map: it left. Only
	 * sockets of the plain map arm one (evict_later, linger_start). */
	if (!valve_on()) {
		__u32 id = st->self_id;
		struct sl_evict_timer *v = bpf_map_lookup_elem(&sl_evict_timers, &id);
		if (!lingers && v && v->gen == st->gen)
			evict_timer_drop(&id, v);
	}
	st->slot = SL_NO_SLOT;
	/* sl_skb follows only sockets TCP delivered bytes to (an empty
	 * segment makes no entry): a bypassed socket seldom has any, and a
	 * delete that finds nothing still locks a bucket of a large table. */
	if ((valve_on() || st->late) && skops->bytes_received) {
		__u64 cookie = bpf_get_socket_cookie(skops);
		bpf_map_delete_elem(&sl_skb_seqs, &cookie);
	}
	count(SL_C_CLOSED, 1);
}

static __always_inline void on_transmit(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	if (!sk)
		return;
	struct sl_sock *st = bpf_sk_storage_get(&sl_sk_state, sk, 0, 0);
	if (!st) {
		set_flags(skops, 0, BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
		return;
	}
	if (st->learn && skops->skb_len) {
		/* A server kept on TCP for its listener (unknown, or predicted
		 * blocking): at its first transmit of data its process has set
		 * the file up (a pure ACK may leave before accept(), or before
		 * the process switched the file to non-blocking), so its mode
		 * is what the listener hands out. */
		struct sock *self = (struct sock *)bpf_skc_to_tcp_sock(sk);
		int b = sock_blocking(self);
		if (b >= 0) {
			struct sl_listener l;
			listener_key(skops, &l);
			learn_listener(&l, b, self, SL_SIG_UNKNOWN);
			st->learn = 0;
		}
	}
	if (st->evict_peer) {
		st->evict_peer = 0;
		if (!sock_leave(st, st->peer_id))
			count(SL_C_EVICTIONS, 1);
	}
	/* The direction into this socket moved to TCP: leave the map once
	 * what was redirected is read, so that the receive path, FIONREAD and
	 * poll are TCP's own again. Our own sends then skip sk_msg too. */
	int pass_in = 0;
	if (st->in_map && !st->evict && st->slot != SL_NO_SLOT) {
		struct sl_conn *c = conn_of(st->slot);
		if (c && word_gen(c->word) == st->gen && c->path[(st->role ^ 1) & 1] == SL_PATH_TCP) {
			__u32 out = st->role & 1;
			st->evict = 1;
			st->path = SL_PATH_TCP;
			if (c->path[out] != SL_PATH_TCP) {
				c->path[out] = SL_PATH_TCP;
				c->reason[out] = c->reason[out ^ 1];
			}
		} else if (c && word_gen(c->word) == st->gen) {
			pass_in = word_state(c->word) == SL_CONN_BYPASS;
		}
	}
	if (valve_on() || st->late)
		valve_window(skops, sk, st, pass_in);
	if (st->evict) {
		/* Leaving the map drops what was redirected to this socket
		 * and not yet read: wait until that is empty, and until the
		 * peer can no longer redirect here. Until then a timer checks
		 * too, without the valve: the reader may send nothing once it
		 * has read (evict_later). */
		if (st->in_map && !may_leave(st->slot, st->role, (struct sock *)bpf_skc_to_tcp_sock(sk))) {
			struct sl_conn *c = conn_of(st->slot);
			if (c && word_gen(c->word) == st->gen)
				evict_later(st, c);
			return;
		}
		st->evict = 0;
		if (st->in_map && !sock_leave(st, st->self_id))
			count(SL_C_EVICTIONS, 1);
		st->in_map = 0;
	}
	if (st->valve || st->lowat)
		valve_lowat(skops, st, !st->in_map);
	if (st->valve || st->cwnd_clamped)
		valve_cwnd(skops, sk, st, !st->in_map);
	/* Off once nothing more can be asked of this callback: the socket
	 * left the map. A bypassed socket hardly transmits, so leaving it on
	 * costs nothing while it may still have to leave. */
	if (!st->in_map && !st->learn)
		set_flags(skops, 0, BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
}

SEC("sockops")
int sl_sockops(struct bpf_sock_ops *skops)
{
	if (sl_settings.bypass != SL_MODE_ON) {
		if (skops->op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB)
			count(SL_C_FALLBACK_BYPASS_OFF, 1);
		return 1;
	}
	switch (skops->op) {
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		on_active(skops);
		break;
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		on_passive(skops);
		break;
	case BPF_SOCK_OPS_HDR_OPT_LEN_CB:
		on_transmit(skops);
		break;
	case BPF_SOCK_OPS_TCP_LISTEN_CB:
		on_listen(skops);
		break;
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
		on_connect(skops);
		break;
	case BPF_SOCK_OPS_TIMEOUT_INIT:
		on_syn(skops);
		break;
	case BPF_SOCK_OPS_STATE_CB:
		if (skops->args[1] != BPF_TCP_CLOSE)
			break;
		if (skops->args[0] == BPF_TCP_LISTEN)
			on_listener_close(skops);
		else
			on_close(skops);
		break;
	}
	return 1;
}

SEC("sk_msg")
int sl_msg(struct sk_msg_md *msg)
{
	struct sl_sock *st = bpf_sk_storage_get(&sl_sk_state, msg->sk, 0, 0);
	if (!st)
		return SK_PASS;
	__u32 len = msg->size;
	struct sl_conn *c = conn_of(st->slot);
	if (!c)
		return SK_PASS;
	__u32 dir = st->role & 1;
	/* One lookup of the counter block serves the whole run. */
	struct sl_counters *cnt = counters();
	if (fast_send(msg, st, c, cnt, len))
		return SK_PASS;
	st->fast_small = 0;

	/* The program runs again only once the kernel used up the window the
	 * previous verdict opened: its rest was redirected, count it now. */
	__u64 redirected = st->win_left;
	st->win_left = 0;
	/* What TCP took since the open valve last passed a send. */
	if (st->valve_mark)
		valve_credit(st, c, (struct sock *)bpf_skc_to_tcp_sock(msg->sk), BPF_TCP_ESTABLISHED);
	/* Where this message starts in its direction's byte stream. */
	__u64 offset = c->bytes[dir] + c->tcp_bytes[dir] + redirected;

	if (st->path == SL_PATH_UNDECIDED)
		decide_client(msg, st, c);
	else if (!st->checked && dir == SL_ROLE_SERVER)
		check_server(msg, st, c);

	if (st->path == SL_PATH_BYPASS && c->path[dir] == SL_PATH_TCP) {
		/* The client moved the whole connection to TCP. */
		st->path = SL_PATH_TCP;
	}
	__u8 reason = 0;
	if (st->path == SL_PATH_BYPASS) {
		struct sl_capture_cfg *cap = capture_of(c);
		__u32 win = window_of(cap, c, dir, len);
		reason = SL_C_FALLBACK_BACKLOG;
		/* With the valve, a send it passes to TCP leaves the direction
		 * bypassed (reason 0), and a window never takes the peer's
		 * queue past the valve's limit. */
		__u32 room = ~0u, mroom = ~0u;
		if (valve_into(st, c, dir ^ 1))
			reason = (room = valve_room(msg, st, c, len, redirected + len, offset, &mroom)) ? SL_C_FALLBACK_PEER_GONE : 0;
		else if (!peer_backlogged(st, c, dir ^ 1, redirected + len, offset, &mroom))
			reason = SL_C_FALLBACK_PEER_GONE;
		if (win > room)
			win = room > len ? room : 0;
		/* A window may cover as many sends as it has bytes beyond
		 * this one's (msgs_held): it takes what window_avail leaves.
		 * A window cut short ends at a whole number of sends of this
		 * size (else it splits the send that crosses its end in two
		 * messages and two verdicts); a large send's is then gone. */
		__u32 avail = window_avail(mroom, msg_budget());
		if (win > (__u64)len + avail)
			win = len < sl_settings.verdict_window && avail >= len ? len + avail / len * len : 0;
		/* What the connection's owner may hold over all its
		 * connections: past it the valve opens, or the direction
		 * moves to TCP, as past the peer's own budget. */
		if (reason == SL_C_FALLBACK_PEER_GONE && msgs_quota(st, c, len, offset, &win)) {
			if (valve_into(st, c, dir ^ 1)) {
				st->valve = 1;
				st->valve_quota = 1;
				count(SL_C_VALVE_OPENS, 1);
				reason = 0;
			} else {
				/* A reader that may get the late verdict is asked
				 * for it now: until its join, this direction
				 * redirects without a window, then the valve holds
				 * the quota. */
				if (!late_on() || !late_quota(st, dir ^ 1))
					reason = SL_C_FALLBACK_BACKLOG;
			}
			count(SL_C_MSG_QUOTA, 1);
		}
		if (reason == SL_C_FALLBACK_PEER_GONE && len < sl_settings.verdict_window && small_stream(msg, st, c, dir, len))
			reason = SL_C_FALLBACK_SMALL_STREAM;
		if (reason == SL_C_FALLBACK_PEER_GONE) {
			if (sock_redirect(msg, st, st->peer_id) == SK_PASS) {
				__u32 window = 0;
				/* Without a window, the next small sends may skip
				 * the verdict where the count just read leaves no
				 * window room for them either (fast_send). */
				st->fast_small = SL_WINDOW_SENDS;
				if (win && !bpf_msg_apply_bytes(msg, win)) {
					st->win_left = win - len;
					window = win;
					st->fast_small = 0;
				}
				count_redirect(st, c, cnt, dir, len, window, redirected);
				if (cap)
					capture(msg, cap, c, st, dir, offset, len);
				return SK_PASS;
			}
		}
		/* A reader given the late verdict while this run looked at its
		 * queue (the timer's callback may run inside it): the valve
		 * takes the send, not TCP for good. Its direction must not move
		 * while its reader has the verdict: TCP's segments would pass
		 * it a message each, past any window (late_quota). */
		if (reason == SL_C_FALLBACK_BACKLOG && late_on() && c->late_joined[(dir ^ 1) & 1]) {
			st->valve = 1;
			count(SL_C_VALVE_OPENS, 1);
			reason = 0;
		}
		/* One-way switch to TCP: never a miss returned as SK_DROP. */
		if (reason) {
			st->path = SL_PATH_TCP;
			c->path[dir] = SL_PATH_TCP;
			c->reason[dir] = reason;
			conn_event(c, SL_EV_FALLBACK, reason, dir, dir);
		}
	}
	c->bytes[dir] += redirected;
	c->tcp_msgs[dir]++;
	/* Still bypassed, yet passed: the open valve's, counted from TCP's
	 * write_seq at the next run or the close (valve_credit). */
	struct tcp_sock *tp = st->path == SL_PATH_BYPASS ? bpf_skc_to_tcp_sock(msg->sk) : 0;
	if (tp) {
		st->valve_seq = tp->write_seq;
		st->valve_mark = 1;
		st->valve_small = len < SL_VALVE_SMALL_SEND;
	} else {
		c->tcp_bytes[dir] += len;
	}
	if (cnt) {
		cnt->c[SL_C_REDIRECT_BYTES] += redirected;
		cnt->c[SL_C_PASS_MSGS]++;
		if (!tp)
			cnt->c[SL_C_PASS_BYTES] += len;
		if (reason && reason < SL_C_MAX)
			cnt->c[reason]++;
	}
	return SK_PASS;
}

/* On sl_sockmap with the valve (--slow-readers valve) only: TCP's bytes
 * for a socket in the map join the queue of the bytes redirected to it, in
 * order of arrival, so that FIONREAD counts both and a redirect after a
 * pass through TCP cannot overtake what TCP delivered.
 *
 * The kernel hands this verdict whole segments from TCP's receive queue
 * (tcp_read_skb), and TCP queues a retransmission that starts before
 * rcv_nxt whole (tcp_data_queue, "partial packet"): tcp_recvmsg skips the
 * bytes it already has by offset, the verdict path would deliver them a
 * second time. So the segment's head, up to where the last segment this
 * program passed ended, is cut off before it is passed (skb_trim_overlap). */
SEC("sk_skb/stream_verdict")
int sl_skb(struct __sk_buff *skb)
{
	/* An empty segment is a FIN's (TCP queues no other): nothing to cut,
	 * and no byte follows it. A short connection's sockets see their
	 * peer's FIN only: no entry, and no cookie, is made for them. */
	__u32 len = skb->len, seq;
	if (!len || skb_tcp_seq(skb, &seq))
		return SK_PASS;
	__u32 end = seq + len;
	__u64 cookie = bpf_get_socket_cookie(skb);
	struct sl_skb_seq *last = bpf_map_lookup_elem(&sl_skb_seqs, &cookie);
	if (!last) {
		struct sl_skb_seq first = {.next = end};
		if (bpf_map_update_elem(&sl_skb_seqs, &cookie, &first, BPF_NOEXIST))
			count(SL_C_ERR_SKB_TRIM, 1);
		return SK_PASS;
	}
	skb_trim_overlap(skb, last->next - seq, len);
	if ((__s32)(end - last->next) > 0)
		last->next = end;
	return SK_PASS;
}

/* The callback of sl_late_timers: gives the readers queued for it the
 * valve's verdict, SL_LATE_BATCH a run (sl_late.h). A subprogram of
 * sl_late_arm, so it runs with a tc program's rights. */
static int late_join(void *map, __u32 *key, struct sl_late_timer *t)
{
	for (int i = 0; i < SL_LATE_BATCH; i++) {
		__u64 v;
		if (bpf_map_pop_elem(&sl_late_queue, &v))
			return 0;
		int err = late_join_one((__u32)v, v >> 32);
		if (err < 0)
			count(SL_C_ERR_LATE_VERDICT, 1);
		else if (!err)
			count(SL_C_LATE_VERDICTS, 1);
	}
	/* More may wait. */
	bpf_timer_start(&t->timer, 0, 0);
	return 0;
}

/* Run by the loader (BPF_PROG_TEST_RUN) with --reader-verdict late, once
 * per timer of sl_late_timers, its index in the context's mark: sets
 * late_join as its callback. One timer a run: a loop over them had 6.1's
 * verifier walk the callback once per iteration, past its million
 * instructions. Returns 0, or 1 (no such timer), 2 (bpf_timer_init
 * failed), 3 (bpf_timer_set_callback failed). */
SEC("tc")
int sl_late_arm(struct __sk_buff *skb)
{
	__u32 k = skb->mark;
	struct sl_late_timer *t = bpf_map_lookup_elem(&sl_late_timers, &k);
	if (!t)
		return 1;
	long err = bpf_timer_init(&t->timer, &sl_late_timers, SL_CLOCK_MONOTONIC);
	if (err && err != -SL_EBUSY)
		return 2;
	if (bpf_timer_set_callback(&t->timer, late_join))
		return 3;
	return 0;
}

/* close() of a managed socket, before the sockmap detaches it. */
SEC("cgroup/sock_release")
int sl_release(struct bpf_sock *sk)
{
	struct sl_sock *st = bpf_sk_storage_get(&sl_sk_state, sk, 0, 0);
	/* Released: a linger that begins later must not (linger_start); one
	 * that began ends now. */
	if (st && __sync_val_compare_and_swap(&st->linger, SL_LINGER_NONE, SL_LINGER_RELEASED) == SL_LINGER_ON) {
		linger_end(st);
		/* Its reads after CLOSE can run TCP's segments through sl_skb
		 * (tcp_bpf_recvmsg_parser hands what waits in the receive
		 * queue, such as a socket's segments from before accept(), to
		 * the verdict) after its close callback removed its entry
		 * there: remove the one they made, which nothing else would
		 * (TestResetBeforeAccept). */
		if (valve_on() || st->late) {
			__u64 cookie = bpf_get_socket_cookie(sk);
			bpf_map_delete_elem(&sl_skb_seqs, &cookie);
		}
	}
	if (!st || st->slot == SL_NO_SLOT || (!st->win_left && !st->valve_mark))
		return 1;
	struct sl_conn *c = conn_of(st->slot);
	/* This program type has no helper from bpf_sock to struct sock; the
	 * connection table holds the socket itself. */
	if (c && word_gen(c->word) == st->gen) {
		struct sock *self = member_sock(st->slot, st->role);
		credit_window(st, c, self);
		valve_credit(st, c, self, sk->state);
	}
	return 1;
}
/* Run by the agent's sweep (BPF_PROG_TEST_RUN) for a slot whose member
 * sockets are all gone (their cgroup was detached, so their close was never
 * seen): frees it, unless it changed since the sweep read it. The agent
 * then removes its index entry and returns it to sl_conn_free (a queue,
 * which a sleepable program cannot use). Returns 1 if it freed the slot. */
SEC("syscall")
int sl_reclaim(struct sl_reclaim_args *a)
{
	__u32 slot = a->slot;
	__u64 old = a->word;
	struct sl_conn *c = conn_of(slot);
	if (!c || word_state(old) == SL_CONN_FREE || !word_members(old))
		return 0;
	__u64 new = mkword(word_gen(old) + 1, SL_CONN_FREE, 0);
	if (__sync_val_compare_and_swap(&c->word, old, new) != old)
		return 0;
	owner_msgs_release(c->owner, c->msgs_charged[0] + c->msgs_charged[1]);
	owner_release(c->owner, SL_HOLD_CONNS);
	bpf_map_delete_elem(&sl_skb_seqs, &c->cookie[0]);
	bpf_map_delete_elem(&sl_skb_seqs, &c->cookie[1]);
	return 1;
}

/* Run by the agent (BPF_PROG_TEST_RUN) for each listener of a cgroup it
 * attaches to that was listening already: its mode (the listening socket's
 * O_NONBLOCK, as for one recorded at listen()) predicts the sockets it
 * hands out, so its first connections need not stay on TCP. A listener
 * already recorded is left as it is. Returns 1 if it recorded it. */
SEC("syscall")
int sl_seed_listener(struct sl_seed_args *a)
{
	struct sl_listener l = {.netns = a->netns, .port = a->port};
	if (bpf_map_lookup_elem(&sl_listeners, &l))
		return 0;
	__u64 owner = a->owner;
	if (!owner_charge(owner, SL_HOLD_LISTENERS)) {
		count(SL_C_LISTENER_QUOTA, 1);
		return 0;
	}
	struct sl_listener_val v = {
		.info = {.owner = owner, .accepted = a->blocking ? SL_ACCEPTED_BLOCKING : SL_ACCEPTED_NONBLOCKING,
			 .signals = a->signals},
	};
	if (bpf_map_update_elem(&sl_listeners, &l, &v, BPF_NOEXIST)) {
		owner_release(owner, SL_HOLD_LISTENERS);
		return 0;
	}
	return 1;
}
