/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: what sl_msg counts for a redirected send, and the sends it
 * redirects without a verdict's reads (fast_send). */
#ifndef SL_REDIRECT_H
#define SL_REDIRECT_H

#include "sl_verdict.h"

/* Counts a send of len bytes sl_msg redirected with a verdict window of
 * win bytes (0: none), and the before bytes of the previous window, which
 * the kernel redirected without a verdict and are counted only now. */
static __always_inline void count_redirect(struct sl_sock *st, struct sl_conn *c, struct sl_counters *cnt,
					   __u32 dir, __u32 len, __u32 win, __u64 before)
{
	/* What this verdict redirects, for small_stream's unit (of small
	 * sends only: a larger one starts over). */
	__u32 unit = st->win_bytes + (win ? win : len);
	st->win_bytes = len >= SL_STREAM_SMALL ? 0 : unit < st->win_bytes ? ~0u : unit;
	msgs_note(st, win, len);
	__u64 redirected = before + len;
	c->msgs[dir]++;
	c->bytes[dir] += redirected;
	if (cnt) {
		cnt->c[SL_C_REDIRECT_MSGS]++;
		cnt->c[SL_C_REDIRECT_BYTES] += redirected;
		cnt->c[SL_C_REDIRECT_WINDOWS] += win != 0;
	}
}

/* Redirects a send of len bytes, and returns 1, where a verdict would
 * read nothing and redirect it without a window: a send in a bypassed
 * direction whose peer's queue was read less than st->check_left bytes
 * ago (valve_room, peer_backlogged), with the valve closed, no window's
 * bytes left to count, the messages counted since within the peer's
 * budget and the owner's charge (msgs_quota), and no capture of this
 * connection running (capture_of). A send of at least the verdict window
 * opens no window; a smaller one (of at least SL_STREAM_SMALL bytes: the
 * small-stream rule watches those below) is taken only where the
 * messages counted leave no window room in the budget's first half (the
 * verdict would open none either: a writer a scheduler slice ahead of its
 * reader on one CPU), after a full verdict that opened no window
 * (st->fast_small), and SL_WINDOW_SENDS times at most, so that a reader
 * that caught up meanwhile gets its windows back within as many sends as
 * a window holds. The count only grows between full verdicts, and a
 * window adds its worst case (a message per byte beyond its send): right
 * after one, only a full verdict's fresh count can tell whether the
 * reader took them. (A window the verdict could open for a larger
 * send, with a budget of messages larger than the send's window, is left
 * out: it only saves verdicts.) The full verdict reads a dozen map values
 * and fields, each a cache line the send's copy has pushed out, and cost
 * a 16 KiB send about 170 ns more than the bare redirect's program; this
 * path touches the socket's state, its direction's counts and path in
 * the connection, the capture settings and the counters
 * (docs/benchmarks.md, The fast path; sl_msg looks the counters up once
 * for either path).
 * Anything else, or a redirect that misses, takes the full verdict.
 * A global function: the verifier checks it once, on its own; inlined, or
 * as a static subprogram, each of its ways out entered the verdict as a
 * state of its own and more than doubled sl_msg's verification. */
__noinline int fast_send(struct sk_msg_md *msg, struct sl_sock *st, struct sl_conn *c, struct sl_counters *cnt, __u32 len)
{
	if (!msg || !st || !c)
		return 0;
	__u32 dir = st->role & 1;
	if (st->path != SL_PATH_BYPASS || c->path[dir] != SL_PATH_BYPASS)
		return 0;
	if (st->check_left <= len || st->win_left || st->valve || st->valve_mark || st->over_since)
		return 0;
	if (dir == SL_ROLE_SERVER && !st->checked)
		return 0;
	/* As the verdict's: room in the peer's budget for this message, and
	 * in the owner's charge without charging more (a whole step). */
	__u32 held = msgs_counted(st), budget = msg_budget();
	if (held >= budget - 1 || held >= c->msgs_charged[dir])
		return 0;
	int small = len < sl_settings.verdict_window;
	/* The room the verdict would size a window by (window_avail). */
	if (small && (len < SL_STREAM_SMALL || !st->fast_small || window_avail(budget - 1 - held, budget) >= len))
		return 0;
	if (capture_of(c))
		return 0;
	if (sock_redirect(msg, st, st->peer_id) != SK_PASS)
		return 0;
	st->check_left -= len;
	/* As small_stream for a send of its size: a stream starts over. */
	if (small) {
		st->fast_small--;
		st->streak = 0;
		st->nodelay_seen = 0;
	}
	count_redirect(st, c, cnt, dir, len, 0, 0);
	if (cnt)
		cnt->c[SL_C_REDIRECT_FAST]++;
	return 1;
}

#endif /* SL_REDIRECT_H */
