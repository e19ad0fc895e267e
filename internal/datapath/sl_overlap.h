/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: TCP segments that repeat bytes already delivered, on their way
 * through the valve's sk_skb verdict (sl_skb). */
#ifndef SL_OVERLAP_H
#define SL_OVERLAP_H

#include "sl_conn.h"

/* One whole step of skb_trim_overlap, a bpf_loop callback. */
struct sl_trim {
	struct __sk_buff *skb;
	int err;
};

static long trim_step(__u64 i, void *data)
{
	struct sl_trim *t = data;
	if (bpf_skb_adjust_room(t->skb, -(__s32)SL_SKB_TRIM_STEP, 0, 0)) {
		t->err = 1;
		return 1;
	}
	return 0;
}

/* Cuts the first over bytes off a TCP segment of len bytes that sl_skb is
 * about to pass, when over is positive (the segment starts before the end
 * of the last one passed): a retransmission that straddles the receiver's
 * rcv_nxt, which TCP queues whole (tcp_data_queue) and the kernel hands the
 * verdict whole (tcp_read_skb), so that passed as it is its head would
 * reach the reader twice. A whole segment that repeats (over >= len) is
 * not cut: TCP drops those before queueing, and an empty pass is still a
 * FIN's. */
static __always_inline void skb_trim_overlap(struct __sk_buff *skb, __u32 over, __u32 len)
{
	if ((__s32)over <= 0 || over >= len)
		return;
	if (over > SL_SKB_TRIM_MAX) {
		count(SL_C_ERR_SKB_TRIM, 1);
		return;
	}
	/* Whole steps through bpf_loop, whose callback the verifier walks
	 * once (a loop here, branching on the bytes left, took it past
	 * 150,000 instructions), then the rest. */
	struct sl_trim t = {.skb = skb};
	__u32 steps = over / SL_SKB_TRIM_STEP, rest = over % SL_SKB_TRIM_STEP;
	if (steps)
		bpf_loop(steps, trim_step, &t, 0);
	if (t.err || (rest && bpf_skb_adjust_room(skb, -(__s32)rest, 0, 0))) {
		count(SL_C_ERR_SKB_TRIM, 1);
		return;
	}
	count(SL_C_SKB_OVERLAPS, 1);
	count(SL_C_SKB_OVERLAP_BYTES, over);
}

#endif /* SL_OVERLAP_H */
