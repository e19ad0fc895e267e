/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: what sl_msg decides with: the first sends of each end (blocking
 * readers), a receiver's backlog, streams of small sends, verdict windows. */
#ifndef SL_VERDICT_H
#define SL_VERDICT_H

#include "sl_conn.h"
#include "sl_listener.h"
#include "sl_capture.h"
#include "sl_late.h"

/* Both directions move to TCP and both sockets leave the map. Called at a
 * socket's first send, so nothing was redirected to its peer yet, which
 * leaves at once; the caller leaves once what was redirected to it is read. */
static __always_inline void leave_for_blocking(struct sl_sock *st, struct sl_conn *c)
{
	st->path = SL_PATH_TCP;
	st->evict = 1;
	st->evict_peer = 1;
	c->path[0] = c->path[1] = SL_PATH_TCP;
	c->reason[0] = c->reason[1] = SL_C_FALLBACK_BLOCKING;
	count(SL_C_FALLBACK_BLOCKING, 1);
	conn_event(c, SL_EV_FALLBACK, SL_C_FALLBACK_BLOCKING, SL_DIR_BOTH, st->role);
}

/* The client's first send commits its direction. */
static __always_inline void decide_client(struct sk_msg_md *msg, struct sl_sock *st, struct sl_conn *c)
{
	__u32 before = word_state(c->word);
	__u32 state = conn_decide(c, st->gen, SL_CONN_TCP, 0);
	if (state == SL_CONN_BYPASS) {
		/* Bytes written before the socket entered the map (a send
		 * that was already waiting for the handshake, TCP Fast Open)
		 * went through TCP: this direction stays there. */
		struct tcp_sock *tp = bpf_skc_to_tcp_sock(msg->sk);
		if (tp && tp->write_seq != st->base_seq) {
			st->path = SL_PATH_TCP;
			c->path[SL_ROLE_CLIENT] = SL_PATH_TCP;
			c->reason[SL_ROLE_CLIENT] = SL_C_FALLBACK_EARLY_DATA;
			count(SL_C_FALLBACK_EARLY_DATA, 1);
			conn_event(c, SL_EV_FALLBACK, SL_C_FALLBACK_EARLY_DATA, SL_ROLE_CLIENT, SL_ROLE_CLIENT);
			return;
		}
		if (c->path[SL_ROLE_CLIENT] == SL_PATH_TCP) {
			/* The server already took the connection to TCP. */
			st->path = SL_PATH_TCP;
			return;
		}
		/* An end that reads in blocking mode (the server, or the
		 * client switched to blocking after connect(), as hiredis
		 * does). */
		if (sl_settings.bypass_blocking != SL_MODE_ON) {
			__u8 ssig = SL_SIG_UNKNOWN, csig = SL_SIG_UNKNOWN;
			int sb = server_blocks(c, st->slot, &ssig);
			int cb = tp ? sock_blocking((struct sock *)tp) : -1;
			/* Read again where the client runs: its process may
			 * have changed its handlers since connect(). */
			if (cb == 1 && sl_settings.bypass_blocking == SL_MODE_PROCESS)
				c->signals[SL_ROLE_CLIENT] = csig = process_signals();
			if (blocking_keeps_tcp(sb, ssig) || blocking_keeps_tcp(cb, csig)) {
				leave_for_blocking(st, c);
				return;
			}
		}
		st->path = SL_PATH_BYPASS;
		c->path[SL_ROLE_CLIENT] = SL_PATH_BYPASS;
		return;
	}
	/* Kept on TCP for a blocking end: learn what the server really is, if
	 * it was accepted already, so that a listener mispredicted as blocking
	 * does not stay so. */
	if (state == SL_CONN_TCP && (c->reason[SL_ROLE_SERVER] == SL_C_FALLBACK_BLOCKING ||
				     c->reason[SL_ROLE_SERVER] == SL_C_FALLBACK_NO_LISTENER)) {
		int b = sock_blocking(member_sock(st->slot, SL_ROLE_SERVER));
		if (b >= 0)
			note_listener(c, st->slot, b, SL_SIG_UNKNOWN);
	}
	/* The server did not join (remote, unmanaged, or not yet accepted):
	 * the whole connection stays on TCP and the client leaves the map at
	 * its next transmit. Nobody ever redirected to it. */
	if (state == SL_CONN_TCP && before == SL_CONN_PENDING) {
		count(SL_C_CONNS_TCP, 1);
		count(SL_C_FALLBACK_PEER_NOT_READY, 1);
		c->reason[SL_ROLE_CLIENT] = SL_C_FALLBACK_PEER_NOT_READY;
		conn_event(c, SL_EV_TCP, SL_C_FALLBACK_PEER_NOT_READY, SL_DIR_BOTH, SL_ROLE_CLIENT);
	}
	st->path = SL_PATH_TCP;
	st->evict = 1;
	c->path[0] = c->path[1] = SL_PATH_TCP;
}

/* The server's first send: a server reading in blocking mode takes the
 * connection to TCP (what the client already redirected is read first). */
static __always_inline void check_server(struct sk_msg_md *msg, struct sl_sock *st, struct sl_conn *c)
{
	st->checked = 1;
	if (sl_settings.bypass_blocking == SL_MODE_ON || c->path[SL_ROLE_SERVER] == SL_PATH_TCP)
		return;
	int b = sock_blocking((struct sock *)bpf_skc_to_tcp_sock(msg->sk));
	if (b < 0)
		return;
	/* The server's process, where it runs: what its listener predicts
	 * for the next connections too. */
	__u8 sig = SL_SIG_UNKNOWN;
	if (b == 1 && sl_settings.bypass_blocking == SL_MODE_PROCESS)
		c->signals[SL_ROLE_SERVER] = sig = process_signals();
	note_listener(c, st->slot, b, sig);
	if (blocking_keeps_tcp(b, sig))
		leave_for_blocking(st, c);
}

/* The messages a receiver's queue may hold (SL_MSG_COST in sl_consts.h):
 * the backlog limit's worth, at least 2. */
static __always_inline __u32 msg_budget(void)
{
	__u32 b = sl_settings.backlog_limit / SL_MSG_COST;
	return b > 2 ? b : 2;
}

/* mq_old + mq_new, saturating. */
static __always_inline __u32 msgs_counted(struct sl_sock *st)
{
	__u32 held = st->mq_old + st->mq_new;
	return held < st->mq_old ? ~0u : held;
}

/* The messages st's redirects left in its peer's queue, at most
 * (SL_MSG_COST in sl_consts.h: each redirected send is one until read,
 * whatever its size). Counted without seeing the sends under a verdict
 * window: one opened by a len-byte send for w bytes covers at most
 * w - len + 1 sends (msgs_note). Two spans of the direction's byte stream
 * are kept: mq_old, sent before mq_end, and mq_new, since. What the reader
 * has consumed is offset (where this send starts) less what is queued;
 * once that reaches mq_end, mq_old's messages are read, and mq_new's take
 * their place, ending at offset. It is exact where every byte sent before
 * offset reached the reader: in the bypass, and with the valve closed (it
 * closes only once TCP delivered all it passed). Bytes that reached the
 * reader around sk_msg (sent before the join, or by sendfile) are counted
 * as unread, which only delays the turn. Called only where sk_psock counts
 * queued bytes (psock_counts_bytes). */
static __always_inline __u32 msgs_held(struct sl_sock *st, __u64 offset, __u32 queued)
{
	if (!queued) {
		st->mq_old = 0;
		st->mq_new = 0;
		st->mq_end = offset;
	} else if (queued <= offset && offset - queued >= st->mq_end) {
		st->mq_old = st->mq_new;
		st->mq_new = 0;
		st->mq_end = offset;
	}
	/* A message holds one byte at least: the queue's bytes bound what
	 * was sent before offset (a small send's window counts a message per
	 * byte it may cover). */
	if (msgs_counted(st) > queued) {
		st->mq_old = queued;
		st->mq_new = 0;
		st->mq_end = offset;
	}
	return msgs_counted(st);
}

/* The messages a redirect of len bytes with a window of win bytes (0:
 * none) leaves at most: this send, and the sends its window may cover,
 * one byte each at the worst. */
static __always_inline __u32 msgs_of(__u32 win, __u32 len)
{
	return win > len ? win - len + 1 : 1;
}

/* a + b, saturating. */
static __always_inline __u32 sat_add(__u32 a, __u32 b)
{
	return a + b < a ? ~0u : a + b;
}

/* Counts a redirect's messages (msgs_held, msgs_of). */
static __always_inline void msgs_note(struct sl_sock *st, __u32 win, __u32 len)
{
	st->mq_new = sat_add(st->mq_new, msgs_of(win, len));
}

/* n messages in whole steps of SL_MSG_CHUNK (saturating). */
static __always_inline __u32 msg_steps(__u32 n)
{
	return n > ~0u - SL_MSG_CHUNK ? ~0u : (n + SL_MSG_CHUNK - 1) / SL_MSG_CHUNK * SL_MSG_CHUNK;
}

/* Brings the owner's charge for direction dir of c from have to want
 * messages (whole steps): more if the owner's quota allows (else returns
 * 0 and leaves it), less once it is over want by more than a step. */
static __always_inline int msgs_settle(struct sl_conn *c, __u32 dir, __u32 have, __u32 want)
{
	if (want > have) {
		if (!owner_msgs_charge(c->owner, want - have))
			return 0;
	} else if (have - want > SL_MSG_CHUNK) {
		owner_msgs_release(c->owner, have - want);
	} else {
		return 1;
	}
	c->msgs_charged[dir & 1] = want;
	return 1;
}

/* The owner's quota of messages (owner_msgs; SL_MSG_CHUNK and SL_MSG_LIGHT
 * in sl_consts.h) for a send of len bytes the bypass is about to redirect
 * with a window of *win bytes (0: none). The direction's charge follows
 * its count (msgs_held) with this redirect's messages (msgs_of), in whole
 * steps. Before charging more, the count is read again from the reader's
 * queue: a reader that keeps up holds no message when the next request
 * comes, so what an idle connection keeps charged is about its last
 * verdict's. Where the quota refuses, the window goes (a send alone is
 * one message), and the send is redirected if its direction then holds
 * fewer than SL_MSG_LIGHT messages. Returns 1 if it must not be. */
static __noinline int msgs_quota(struct sl_sock *st, struct sl_conn *c, __u32 len, __u64 offset, __u32 *win)
{
	if (!psock_counts_bytes())
		return 0;
	__u32 dir = st->role & 1;
	__u32 have = c->msgs_charged[dir];
	__u32 want = msg_steps(sat_add(msgs_counted(st), msgs_of(*win, len)));
	if (want <= have) {
		msgs_settle(c, dir, have, want);
		return 0;
	}
	struct sock *peer = member_sock(st->slot, dir ^ 1);
	__u32 held = peer ? msgs_held(st, offset, queued_bytes(peer)) : msgs_counted(st);
	if (msgs_settle(c, dir, have, msg_steps(sat_add(held, msgs_of(*win, len)))))
		return 0;
	*win = 0;
	if (held < SL_MSG_LIGHT || msgs_settle(c, dir, have, msg_steps(sat_add(held, 1))))
		return 0;
	owner_msgs_refused(c->owner);
	return 1;
}

/* The messages a verdict window may add where the peer may still take
 * mroom after the send, of a budget of budget (msg_budget): windows take
 * only its first half (a window counts at its worst, a message per byte
 * beyond its send; past the half a verdict per send counts them
 * exactly). sl_msg sizes its windows by it, and fast_send takes a small
 * send only where it leaves no window. */
static __always_inline __u32 window_avail(__u32 mroom, __u32 budget)
{
	__u32 half = budget / 2;
	return mroom > half ? mroom - half : 0;
}

/* Whether the direction of st should leave the bypass because its peer
 * is not reading: the kernel charges redirected bytes to the receiver but
 * never compares them with its buffer, so without this a slow reader grows
 * without bound. The limit is max(SO_RCVBUF, backlog_limit) bytes, and
 * msg_budget() messages (msgs_held). A queue over either counts once it
 * has stayed over for SL_BACKLOG_GRACE (a writer on its reader's CPU runs
 * a scheduler slice ahead, tens of MiB at 64 KiB sends, and the reader
 * then drains it), or at once over SL_BACKLOG_CAP times it.
 * The time is read only while over the limit, the queue once per
 * SL_BACKLOG_CHECK_BYTES sent while under it (sent: the bytes since the
 * last run), or once the room under the limit found at the last read is
 * used up where that was more (at most SL_ROOM_CHECK_BYTES: the queue
 * can only have shrunk since), or when the messages counted reach the
 * budget. *mroom: the messages the peer may still take after this send. */
static __noinline int backlog_read(struct sl_sock *st, const struct sl_conn *c, __u32 peer_role, __u64 offset, __u32 *mroom);

static __always_inline int peer_backlogged(struct sl_sock *st, const struct sl_conn *c, __u32 peer_role, __u32 sent, __u64 offset,
					   __u32 *mroom)
{
	if (!sl_settings.backlog_limit || !psock_counts_bytes())
		return 0;
	/* Under the limit when last read: read again once
	 * SL_BACKLOG_CHECK_BYTES more were sent, or the messages counted
	 * since (at most) leave no room for this one, or reach half the
	 * budget where the reader may still be asked for the late verdict
	 * (backlog_read asks there). */
	__u32 held = msgs_counted(st), budget = msg_budget();
	__u32 read_at = late_on() && !c->late_asked[peer_role & 1] ? budget / 2 : budget - 1;
	if (!st->over_since && st->check_left > sent && held < read_at) {
		st->check_left -= sent;
		*mroom = budget - 1 - held;
		return 0;
	}
	return backlog_read(st, c, peer_role, offset, mroom);
}

/* peer_backlogged's read of the peer's queue. A subprogram: its branches
 * (the late verdict's ask, the limit, the grace) stay out of sl_msg's
 * states, which the valve's room doubles where readers get its verdict
 * late. Until the reader is asked for the late verdict, it is read at
 * least every SL_BACKLOG_CHECK_BYTES, and asked once it holds
 * SL_LATE_ASK_BYTES or half its budget of messages: the join then comes
 * before the limit, the budget or their grace would move the direction
 * to TCP, within microseconds, or a time slice where the writer keeps
 * the timer's CPU busy (docs/ARCHITECTURE.md, Why the late verdict is
 * not the default yet). */
static __noinline int backlog_read(struct sl_sock *st, const struct sl_conn *c, __u32 peer_role, __u64 offset, __u32 *mroom)
{
	if (!st || !c || !mroom)
		return 0;
	__u32 budget = msg_budget();
	st->check_left = SL_BACKLOG_CHECK_BYTES;
	struct sock *peer = member_sock(st->slot, peer_role);
	if (!peer)
		return 0;
	__u64 queued = queued_bytes(peer);
	__u32 held = msgs_held(st, offset, queued);
	if (late_on() && (queued >= SL_LATE_ASK_BYTES || held >= budget / 2))
		late_ask(st, peer_role);
	__u64 limit = sl_settings.backlog_limit;
	int rcvbuf = peer->sk_rcvbuf;
	if (rcvbuf > 0 && (__u64)rcvbuf > limit)
		limit = rcvbuf;
	*mroom = held < budget ? budget - 1 - held : 0;
	if (queued <= limit && held < budget) {
		__u64 room = limit - queued;
		st->over_since = 0;
		if (room > SL_BACKLOG_CHECK_BYTES && (!late_on() || c->late_asked[peer_role & 1]))
			st->check_left = room < SL_ROOM_CHECK_BYTES ? room : SL_ROOM_CHECK_BYTES;
		return 0;
	}
	int msgs = queued <= limit;
	if (queued > SL_BACKLOG_CAP * limit || held >= SL_BACKLOG_CAP * budget)
		goto over;
	__u32 now = (__u32)(bpf_ktime_get_ns() >> 20) | 1;
	if (!st->over_since) {
		st->over_since = now;
		return 0;
	}
	if (now - st->over_since <= SL_BACKLOG_GRACE)
		return 0;
over:
	if (msgs)
		count(SL_C_MSG_BUDGET, 1);
	return 1;
}

/* The messages st's peer holds (msgs_held) for the open valve's close,
 * or ~0 while it must stay open for its owner's quota of messages
 * (msgs_quota): until the reader took all but a light direction's, or the
 * owner has room for a step again. Else it would close at every send TCP
 * delivered, and each would pass alone: a TCP segment per 1-byte write,
 * each a message in the reader's queue. */
static __noinline __u32 valve_held(struct sl_sock *st, struct sl_conn *c, __u64 offset, __u32 queued)
{
	__u32 held = msgs_held(st, offset, queued);
	if (st->valve_quota && held >= SL_MSG_LIGHT && !owner_msgs_room(c->owner))
		return ~0u;
	return held;
}

/* The queue valve_room (below) lets peer hold. A subprogram: its
 * branches on the peer's buffer and window stay out of sl_msg's states. */
static __noinline __u32 valve_limit(struct sock *peer)
{
	if (!peer)
		return 0;
	int rcvbuf = peer->sk_rcvbuf;
	__u32 limit = rcvbuf > 2 * SL_VALVE_MARGIN ? rcvbuf - SL_VALVE_MARGIN : (__u32)rcvbuf / 2;
	/* The room TCP's first flight needs: its whole window. */
	__u32 full = tcp_window_open(peer), grow = rcvbuf_growth(peer);
	if (rcvbuf <= 0 || full >= (__u32)rcvbuf)
		limit = 0;
	else if (limit > (__u32)rcvbuf - full)
		limit = (__u32)rcvbuf - full;
	/* The floor, as far as the buffer may be raised with twice the
	 * window free for the flight. */
	if (rcvbuf > 0) {
		__u32 floor = sl_settings.backlog_limit / 2;
		__u64 fits = (__u64)rcvbuf + grow, flight = 2 * (__u64)full;
		if (floor > SL_VALVE_FLOOR)
			floor = SL_VALVE_FLOOR;
		if (fits < floor + flight)
			floor = fits > flight ? fits - flight : 0;
		if (limit < floor)
			limit = floor;
	}
	return limit;
}

/* The valve (--slow-readers valve, SL_VALVE_* in sl_consts.h): the bytes
 * st's socket may still redirect before its peer's queue comes within
 * SL_VALVE_MARGIN of the peer's SO_RCVBUF, or within the room TCP's
 * next flight needs (below), or 0 if this send of len bytes passes to
 * TCP. The kernel charges redirected bytes to the receiver's buffer and
 * drops TCP segments arriving past it, so the valve opens before the
 * queue gets there; TCP's window and send buffer then pace the writer,
 * and TCP's bytes join the redirected ones in the receiver's queue (the
 * sk_skb verdict), in order and counted by FIONREAD. The window matters
 * because redirected bytes send no ACK: the writer's TCP still holds the
 * window the receiver offered before the queue grew, and sends that much
 * at once when the valve opens (a sticky pass verdict sends later writes
 * too without asking). A queue within that window of SO_RCVBUF leaves the
 * receiver no room: it advertises a zero window and drops the rest of the
 * flight (TCPZeroWindowDrop), which costs the writer a retransmission
 * timeout (200 ms or more) each time. So the queue leaves the whole
 * window free. Leaving half of it while the buffer might still grow by
 * that much (TCP's segment past SO_RCVBUF raising it, tcp_clamp_window)
 * dropped in 7 of 95 2-second runs of iperf3 on one CPU on 6.18 (a failed
 * allocation stores a zero window, and the rest of the flight meets it),
 * and was slower: 5.69 against 6.93 GB in 2 s, medians of 45 runs each
 * (docs/benchmarks.md, The whole window, again).
 * A buffer only redirected bytes fill never grows (TCP's autotuning
 * counts what TCP delivers), so at the default 128 KiB the valve would
 * open at 64 KiB of queue under a reader that keeps up (python's
 * http.server, 64 KiB writes), and under a buffer the valve's few TCP
 * bytes grew to a few MB it cycled some 900 times a second for a 16 KiB
 * stream on one CPU. So the limit is at least SL_VALVE_FLOOR (or half the
 * backlog limit, if less), as far as the buffer may be raised with twice
 * the offered window free: TCP's first segment past the buffer raises it
 * to what is queued (tcp_clamp_window), and its windows then follow the
 * room left, as for TCP's own bytes. The window the valve's clamp keeps
 * at 64 KiB (valve_window in sl_valve_tcp.h) makes that flight small.
 * A send into a queue at most half the limit is redirected whatever its
 * size (a request or response larger than the limit keeps the bypass
 * while its reader keeps up): the queue is bounded by half the limit plus
 * one send, which the kernel caps at MAX_MSG_FRAGS page fragments (about
 * half a MiB); TCP's bytes arriving past SO_RCVBUF then raise it
 * (tcp_clamp_window) rather than being dropped, and the limit with it.
 * It closes once the peer's TCP has every byte sent through it, each of
 * them is in the peer's psock queue or read (none waits in TCP's receive
 * queue or for the psock's worker: a redirect would overtake it), and the
 * queue is under half the limit.
 * It opens too for a send that finds the peer's queue holding msg_budget()
 * messages (msgs_held), and closes only once it holds at most half of them.
 * With the valve closed the peer is read again only once the room it had
 * at the last read (st->check_left, at most SL_ROOM_CHECK_BYTES, less
 * what was sent since: sent, the bytes since the last run) no longer
 * covers this send, or the messages counted since leave no room for it:
 * the queue can only have shrunk, so no send it lets through would have
 * opened the valve, and a window stays within that room. Reading the peer
 * (its queue, buffer and window: cache lines its reader writes) at every
 * 64 KiB send was most of what sl_msg cost over a bare redirect
 * (docs/benchmarks.md, The fast path); sends that need no read skip the
 * verdict's other checks too (fast_send in sl_redirect.h). Not for
 * a send under the verdict window: its window counts a message per byte
 * at the worst (msgs_note), which only a read of the queue takes back, and
 * without one the count soon leaves no room for windows (half the budget
 * of messages), and small sends would take a verdict each; such a verdict
 * covers up to 64 sends anyway.
 * *mroom: the messages the peer may still take after this send. */
static __always_inline __u32 valve_room(struct sk_msg_md *msg, struct sl_sock *st, struct sl_conn *c, __u32 len, __u32 sent, __u64 offset, __u32 *mroom)
{
	__u32 held = msgs_counted(st), budget = msg_budget();
	if (!st->valve && len >= sl_settings.verdict_window && st->check_left > sent && held < budget - 1) {
		st->check_left -= sent;
		*mroom = budget - 1 - held;
		return st->check_left + len;
	}
	st->check_left = 0;
	struct sock *peer = member_sock(st->slot, st->role ^ 1);
	if (!peer)
		return len; /* the redirect misses: the caller moves to TCP */
	__u32 queued = queued_bytes(peer);
	__u32 limit = valve_limit(peer);
	if (st->valve) {
		struct tcp_sock *tp = bpf_skc_to_tcp_sock(msg->sk);
		if (!tp || queued > limit / 2 || tcp_rcv_nxt(peer) != tp->write_seq || tcp_bytes_waiting(peer))
			return 0;
		/* Read only now: until TCP delivered what the valve passed,
		 * offset counts bytes the reader cannot have read. */
		if ((held = valve_held(st, c, offset, queued)) > budget / 2)
			return 0;
		st->valve = 0;
		st->valve_quota = 0;
		count(SL_C_VALVE_CLOSES, 1);
	} else if ((held = msgs_held(st, offset, queued)) >= budget) {
		st->valve = 1;
		count(SL_C_VALVE_OPENS, 1);
		count(SL_C_MSG_BUDGET, 1);
		return 0;
	} else if (queued + len > limit && queued > limit / 2) {
		st->valve = 1;
		count(SL_C_VALVE_OPENS, 1);
		return 0;
	}
	*mroom = budget - 1 - held;
	__u32 room = queued < limit ? limit - queued : 1;
	__u32 ahead = room < SL_ROOM_CHECK_BYTES ? room : SL_ROOM_CHECK_BYTES;
	if (ahead > len)
		st->check_left = ahead - len;
	return room;
}

/* The verdict window a send under verdict_window opens: SL_WINDOW_SENDS
 * sends of its size, at most verdict_window bytes (0 with windows off). */
static __always_inline __u32 small_window(__u32 len)
{
	__u32 w = sl_settings.verdict_window;
	__u64 s = (__u64)len * SL_WINDOW_SENDS;
	return s < w ? (__u32)s : w;
}

/* Whether the direction of st streams small sends one way, fast enough
 * that TCP, which coalesces them, is faster (SL_STREAM_* in sl_consts.h).
 * Runs at every verdict of a small send the bypass would redirect, with
 * or without a window. The sends are judged in units of at least
 * small_window(len) bytes: st->win_bytes is what the verdicts since
 * st->win_at redirected (a window's bytes, or the send alone when a
 * reader behind by half its budget of messages leaves no room for one:
 * msgs_held), so a unit is one full window, or the windowless sends that
 * add up to one. Only the verdict that completes a unit reads the clock
 * and the peer: its sends (about win_bytes / len of them) count toward
 * the streak if they came at most SL_STREAM_GAP apart on average; a
 * slower unit (a pause, a preempted writer) does not count. Anything sent
 * the other way during the unit (its verdicts, and what is left of its
 * own window, compared with what it had sent when the unit began) starts
 * the streak over. A writer that set TCP_NODELAY keeps
 * the bypass: TCP would send each of its writes as a segment of its own,
 * slower than the bypass's message. */
static __always_inline int small_stream(struct sk_msg_md *msg, struct sl_sock *st, struct sl_conn *c, __u32 dir, __u32 len)
{
	if (sl_settings.bypass_small_streams == SL_MODE_ON)
		return 0;
	/* A larger send starts over; it needs neither the clock nor the
	 * peer (a stale snapshot only makes the next unit count less). */
	if (len >= SL_STREAM_SMALL) {
		st->streak = 0;
		st->nodelay_seen = 0;
		st->win_bytes = 0;
		return 0;
	}
	/* The unit goes on: this send joins it, and nothing else is read
	 * (the other direction's count is cumulative, so what it sent
	 * meanwhile shows at the unit's end). */
	if (st->win_bytes < small_window(len))
		return 0;
	__u32 now = (__u32)(bpf_ktime_get_ns() >> 10);
	__u32 other = dir ^ 1;
	__u32 rev = (__u32)(c->msgs[other] + c->tcp_msgs[other]) * 65537u + window_left(member_sock(st->slot, other));
	int fast = (__u64)(now - st->win_at) * len <= (__u64)SL_STREAM_GAP * st->win_bytes;
	st->win_bytes = 0;
	st->win_at = now;
	if (rev != st->rev_seen) {
		st->rev_seen = rev;
		st->streak = 0;
		st->nodelay_seen = 0;
		return 0;
	}
	if (!fast)
		return 0;
	if (st->streak < SL_STREAM_WINDOWS)
		st->streak++;
	if (st->streak < SL_STREAM_WINDOWS)
		return 0;
	/* Read at each unit: the writer may turn Nagle back on. */
	if (tcp_coalesces(bpf_skc_to_tcp_sock(msg->sk)))
		return 1;
	/* Counted once a stream: until the other direction sends or a
	 * larger send starts over. */
	if (!st->nodelay_seen) {
		st->nodelay_seen = 1;
		count(SL_C_SMALL_STREAM_NODELAY, 1);
	}
	return 0;
}

/* The verdict window a redirect of a len-byte send opens (0: none): the
 * kernel then redirects the next that-many bytes, this send included,
 * without running sl_msg. A send under verdict_window opens one of
 * small_window(len) bytes (for small sends the verdict is most of the
 * cost; SL_WINDOW_SENDS keeps the decisions it takes within 64 sends);
 * a larger one under SL_LARGE_WINDOW opens one of SL_LARGE_WINDOW (a
 * verdict is then 1-5% of a send's cost; above it, under 1%). None for
 * a direction's first send (its verdict count is exact up to there, which
 * is what tells a brief connection), with windows off (verdict_window 0),
 * or for a connection being captured, which gets a verdict per send so
 * that every send is seen. */
static __always_inline __u32 window_of(struct sl_capture_cfg *cap, struct sl_conn *c, __u32 dir, __u32 len)
{
	__u32 w = sl_settings.verdict_window;
	if (!w || !c->msgs[dir] || cap)
		return 0;
	if (len < w)
		return small_window(len);
	return len < SL_LARGE_WINDOW ? SL_LARGE_WINDOW : 0;
}

#endif /* SL_VERDICT_H */
