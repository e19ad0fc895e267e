/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: capture of bypassed messages into the sl_capture ring. */
#ifndef SL_CAPTURE_H
#define SL_CAPTURE_H

#include "sl_conn.h"

/* The capture settings if this connection is being captured now; NULL
 * otherwise. With no capture running this is one array lookup. */
static __always_inline struct sl_capture_cfg *capture_of(struct sl_conn *c)
{
	__u32 zero = 0;
	struct sl_capture_cfg *cfg = bpf_map_lookup_elem(&sl_cap_settings, &zero);
	if (!cfg || !cfg->until_ns)
		return 0;
	if (bpf_ktime_get_ns() >= cfg->until_ns)
		return 0;
	if (cfg->port && cfg->port != c->client.local_port && cfg->port != c->client.remote_port)
		return 0;
	if (cfg->netns && cfg->netns != c->client_netns && cfg->netns != c->server_netns)
		return 0;
	return cfg;
}

/* Whether the per-CPU token bucket lets one more message be captured. */
static __always_inline int capture_allowed(struct sl_capture_cfg *cfg)
{
	if (!cfg->rate)
		return 1;
	__u32 zero = 0;
	struct sl_cap_bucket *b = bpf_map_lookup_elem(&sl_cap_tokens, &zero);
	if (!b)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 elapsed = now - b->last_ns;
	if (elapsed >= 1000000000ull) {
		b->tokens = cfg->rate;
		b->last_ns = now;
	} else {
		__u64 add = elapsed * cfg->rate / 1000000000ull;
		if (add) {
			b->tokens += add;
			if (b->tokens > cfg->rate)
				b->tokens = cfg->rate;
			b->last_ns = now;
		}
	}
	if (!b->tokens)
		return 0;
	b->tokens--;
	return 1;
}

/* Copies the head of a bypassed message, with its connection and stream
 * offset, into the capture ring. */
static __always_inline void capture(struct sk_msg_md *msg, struct sl_capture_cfg *cfg, struct sl_conn *c,
				    struct sl_sock *st, __u32 dir, __u64 offset, __u32 len)
{
	if (!capture_allowed(cfg)) {
		count(SL_C_CAPTURE_RATE_DROPS, 1);
		return;
	}
	struct sl_cap_rec *r = bpf_ringbuf_reserve(&sl_capture, sizeof(*r), 0);
	if (!r) {
		count(SL_C_CAPTURE_LOST, 1);
		return;
	}
	__u32 n = cfg->snap;
	if (n > len)
		n = len;
	if (n > SL_CAP_SNAP_MAX - 1)
		n = SL_CAP_SNAP_MAX - 1;
	r->h.ts_ns = bpf_ktime_get_ns();
	r->h.offset = offset;
	if (dir == SL_ROLE_CLIENT) {
		copy_ip(r->h.src_ip, c->client.local_ip);
		copy_ip(r->h.dst_ip, c->client.remote_ip);
		r->h.src_port = c->client.local_port;
		r->h.dst_port = c->client.remote_port;
	} else {
		copy_ip(r->h.src_ip, c->client.remote_ip);
		copy_ip(r->h.dst_ip, c->client.local_ip);
		r->h.src_port = c->client.remote_port;
		r->h.dst_port = c->client.local_port;
	}
	r->h.len = len;
	r->h.slot = st->slot;
	r->h.gen = st->gen;
	r->h.dir = dir;
	r->h.caplen = 0;
	if (n) {
		if ((long)msg->data + n > (long)msg->data_end)
			bpf_msg_pull_data(msg, 0, n, 0);
		void *data = msg->data;
		void *end = msg->data_end;
		/* The bound in the register passed: clang drops a plain mask it
		 * can prove redundant, and older verifiers (6.1) then see the
		 * length unbounded. */
		asm volatile("%0 &= %1" : "+r"(n) : "i"(SL_CAP_SNAP_MAX - 1));
		if (data + n <= end && !bpf_probe_read_kernel(r->data, n, data))
			r->h.caplen = n;
	}
	bpf_ringbuf_submit(r, 0);
	count(SL_C_CAPTURED, 1);
}

#endif /* SL_CAPTURE_H */
