/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: a connection's 4-tuple as sock_ops sees it (struct sl_tuple),
 * and the same connection from its other end. */
#ifndef SL_TUPLE_H
#define SL_TUPLE_H

#include <linux/bpf.h>
#include <bpf/bpf_endian.h>
#include "sl_structs.h"

static __always_inline int is_loopback(const __u32 ip[4])
{
	/* ::1 */
	if (ip[0] == 0 && ip[1] == 0 && ip[2] == 0 && ip[3] == bpf_htonl(1))
		return 1;
	/* ::ffff:127.0.0.0/8 */
	if (ip[0] == 0 && ip[1] == 0 && ip[2] == bpf_htonl(0xffff) &&
	    (bpf_ntohl(ip[3]) >> 24) == 127)
		return 1;
	return 0;
}

/* Fills t with the socket's own view of its connection. Returns 0 for
 * IPv4/IPv6 TCP sockets, -1 otherwise. */
static __always_inline int tuple_of(struct bpf_sock_ops *skops, struct sl_tuple *t)
{
	/* Every field is read once, up front, at its constant offset: read
	 * inside the family branches, clang merged the IPv4 and IPv6 loads
	 * into one load at a computed context offset, which the verifier
	 * refuses ("dereference of modified ctx ptr"). */
	__u32 family = skops->family;
	__u32 l4 = skops->local_ip4, r4 = skops->remote_ip4;
	__u32 l6[4] = {skops->local_ip6[0], skops->local_ip6[1], skops->local_ip6[2], skops->local_ip6[3]};
	__u32 r6[4] = {skops->remote_ip6[0], skops->remote_ip6[1], skops->remote_ip6[2], skops->remote_ip6[3]};
	__u32 lport = skops->local_port, rport = skops->remote_port;

	__builtin_memset(t, 0, sizeof(*t));
	if (family == AF_INET) {
		t->local_ip[2] = bpf_htonl(0xffff);
		t->local_ip[3] = l4;
		t->remote_ip[2] = bpf_htonl(0xffff);
		t->remote_ip[3] = r4;
	} else if (family == AF_INET6) {
		copy_ip(t->local_ip, l6);
		copy_ip(t->remote_ip, r6);
	} else {
		return -1;
	}
	t->local_port = lport;
	t->remote_port = bpf_ntohl(rport);
	t->local_seq = skops->snd_nxt;
	t->remote_seq = skops->rcv_nxt;
	if (is_loopback(t->remote_ip))
		t->netns = bpf_get_netns_cookie(skops);
	return 0;
}

/* Whether two tuples are the same, word by word: every field counts, and
 * pad is zeroed wherever a tuple is made (tuple_of, reverse). */
static __always_inline int tuple_same(const struct sl_tuple *a, const struct sl_tuple *b)
{
	_Static_assert(sizeof(struct sl_tuple) % 8 == 0, "sl_tuple is compared in 64-bit words");
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;
	__u64 diff = 0;
#pragma unroll
	for (int i = 0; i < (int)(sizeof(*a) / 8); i++)
		diff |= x[i] ^ y[i];
	return !diff;
}

static __always_inline void reverse(const struct sl_tuple *in, struct sl_tuple *out)
{
	__builtin_memset(out, 0, sizeof(*out));
	out->local_ip[0] = in->remote_ip[0];
	out->local_ip[1] = in->remote_ip[1];
	out->local_ip[2] = in->remote_ip[2];
	out->local_ip[3] = in->remote_ip[3];
	out->remote_ip[0] = in->local_ip[0];
	out->remote_ip[1] = in->local_ip[1];
	out->remote_ip[2] = in->local_ip[2];
	out->remote_ip[3] = in->local_ip[3];
	out->local_port = in->remote_port;
	out->remote_port = in->local_port;
	out->local_seq = in->remote_seq;
	out->remote_seq = in->local_seq;
	out->netns = in->netns;
}

#endif /* SL_TUPLE_H */
