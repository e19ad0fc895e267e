/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: what the valve sets on a bypassed socket's TCP from sock_ops
 * (ARCHITECTURE.md, Who decides): the unsent bytes its writer may queue
 * (valve_lowat), its congestion window (valve_cwnd) and its offered
 * window (valve_window) while passes run, and no pacing (unpace). */
#ifndef SL_VALVE_TCP_H
#define SL_VALVE_TCP_H

/* While st's valve is open (valve_room), its socket sleeps in send() once
 * SL_VALVE_LOWAT of its sends passed to TCP are unsent, unless its
 * application chose a TCP_NOTSENT_LOWAT of its own; closed, or once the
 * socket leaves the map (leaving), TCP's default is back. Run at the
 * socket's transmits: the first segment of a pass through TCP sets it. */
static __always_inline void valve_lowat(struct bpf_sock_ops *skops, struct sl_sock *st, int leaving)
{
	int want = st->valve && !leaving;
	if (want == !!st->lowat)
		return;
	int v = 0;
	if (!want) {
		if (st->lowat == SL_LOWAT_OURS)
			bpf_setsockopt(skops, SL_SOL_TCP, SL_TCP_NOTSENT_LOWAT, &v, sizeof(v));
		st->lowat = 0;
		return;
	}
	st->lowat = SL_LOWAT_THEIRS;
	if (bpf_getsockopt(skops, SL_SOL_TCP, SL_TCP_NOTSENT_LOWAT, &v, sizeof(v)) || v)
		return;
	v = SL_VALVE_LOWAT;
	if (!bpf_setsockopt(skops, SL_SOL_TCP, SL_TCP_NOTSENT_LOWAT, &v, sizeof(v)))
		st->lowat = SL_LOWAT_OURS;
}

/* While st's valve is open and passes sends under SL_VALVE_SMALL_SEND
 * (sl_consts.h), the socket's congestion window is at most
 * SL_VALVE_SMALL_CWND segments, so that TCP merges the sends it holds back
 * into few segments, each a message in the reader's queue; closed, once it
 * passes larger sends, or once the socket leaves the map (leaving), the
 * clamp it replaced is back. Run at the socket's transmits. The kernel sets
 * the slow-start threshold with the clamp (TCP_BPF_SNDCWND_CLAMP), so the
 * socket's TCP starts over in slow start when it is given back. */
static __always_inline void valve_cwnd(struct bpf_sock_ops *skops, struct bpf_sock *sk, struct sl_sock *st, int leaving)
{
	int want = st->valve && st->valve_small && !leaving;
	if (want == st->cwnd_clamped)
		return;
	int v;
	if (!want) {
		st->cwnd_clamped = 0;
		v = st->cwnd_saved > 0x7fffffff ? 0x7fffffff : (int)st->cwnd_saved;
		bpf_setsockopt(skops, SL_SOL_TCP, SL_TCP_BPF_SNDCWND_CLAMP, &v, sizeof(v));
		return;
	}
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		return;
	st->cwnd_saved = tp->snd_cwnd_clamp;
	v = SL_VALVE_SMALL_CWND;
	if (!bpf_setsockopt(skops, SL_SOL_TCP, SL_TCP_BPF_SNDCWND_CLAMP, &v, sizeof(v))) {
		st->cwnd_clamped = 1;
		count(SL_C_VALVE_CWND_CLAMPS, 1);
	}
}

/* While the valve may pass its peer's sends (want: both ends joined, a
 * client whose server is remote or not attached never is; the socket in
 * the map and its incoming direction not moved to TCP), a socket's TCP
 * offers its peer at most SL_VALVE_WINDOW: redirected bytes
 * send no ACK, so each time the valve opens the writer's TCP sends at once
 * the whole window its reader last offered (170-270 KB under autotuning),
 * and those bytes take the slow way while the writer does not sleep: 3.7% of 16 KiB
 * one-CPU streams' bytes went through TCP, 1.7% with the clamp
 * (docs/benchmarks.md, *The valve's window, clamped*). Run at the socket's
 * transmits, the ACKs of what the valve passed among them: autotuning
 * raises the clamp with the buffer (tcp_rcv_space_adjust), and the next
 * transmit lowers it again. The clamp it replaced, the largest seen, is
 * given back once the valve can no longer pass (leaving), unless the
 * application or autotuning set another since; a clamp the application
 * set at or below SL_VALVE_WINDOW is left alone. A socket that leaves the
 * map without a transmit (socklane down --force) keeps the clamp until
 * autotuning raises it. */
static __always_inline void valve_window(struct bpf_sock_ops *skops, struct bpf_sock *sk, struct sl_sock *st, int want)
{
	if (!want && !st->clamped)
		return;
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		return;
	__u32 clamp = tp->window_clamp;
	int v;
	if (!want) {
		st->clamped = 0;
		count(SL_C_VALVE_UNCLAMPS, 1);
		if (clamp != SL_VALVE_WINDOW || st->clamp_saved <= clamp)
			return;
		v = st->clamp_saved;
		bpf_setsockopt(skops, SL_SOL_TCP, SL_TCP_WINDOW_CLAMP, &v, sizeof(v));
		return;
	}
	if (clamp <= SL_VALVE_WINDOW)
		return;
	if (!st->clamped || clamp > st->clamp_saved)
		st->clamp_saved = clamp;
	v = SL_VALVE_WINDOW;
	if (!bpf_setsockopt(skops, SL_SOL_TCP, SL_TCP_WINDOW_CLAMP, &v, sizeof(v))) {
		st->clamped = 1;
		count(SL_C_VALVE_CLAMPS, 1);
	}
}

/* A connection of the bypass runs socket to socket on this node; TCP
 * carries only what the valve passes, to push its writer back. A
 * congestion control that paces (BBR) spaces those passes out by a rate it
 * estimates from a path it hardly sees, and the writer and its reader wait
 * for it: with BBR, 16 KiB streams on one CPU ran at 0.55-0.65 of the
 * backlog rule's speed, with reno on the writer at 0.93-1.02
 * (docs/benchmarks.md, *The valve waited for BBR's pacing*). So a socket
 * joining the bypass with the valve on, whose congestion control is BBR,
 * gets cubic (reno where cubic is not built in) in its established
 * callback: the kernel then starts cubic instead, and the socket never
 * paces (BBR marks a socket for pacing when it starts, and by the kernel's
 * code nothing clears the mark). Any other choice is left alone. */
static __always_inline void unpace(struct bpf_sock_ops *skops)
{
	if (sl_settings.backlog_valve != SL_MODE_ON)
		return;
	char cc[SL_TCP_CA_NAME_MAX] = {};
	if (bpf_getsockopt(skops, SL_SOL_TCP, SL_TCP_CONGESTION, cc, sizeof(cc)))
		return;
	if (cc[0] != 'b' || cc[1] != 'b' || cc[2] != 'r' || cc[3])
		return;
	char cubic[] = "cubic", reno[] = "reno";
	if (bpf_setsockopt(skops, SL_SOL_TCP, SL_TCP_CONGESTION, cubic, sizeof(cubic)) &&
	    bpf_setsockopt(skops, SL_SOL_TCP, SL_TCP_CONGESTION, reno, sizeof(reno)))
		return;
	count(SL_C_CC_UNPACED, 1);
}

#endif /* SL_VALVE_TCP_H */
