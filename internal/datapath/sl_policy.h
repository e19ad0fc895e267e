/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: the network policy decision, made once per connection.
 *
 * Egress is judged where the client connects (connect4/6, and sendmsg4/6
 * for unconnected UDP), after the service translation: against the
 * backend actually chosen. Ingress of a pod on this node is judged there
 * too when the client is a pod of this node (both ends are known), and
 * always at the server's socket on the first packet of a flow (TCP SYN,
 * a UDP flow's first datagram), where clients from other nodes and the
 * host network arrive. Established traffic leaves the packet hook after
 * reading the TCP flags. */
#ifndef SL_POLICY_H
#define SL_POLICY_H

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "sl_pol_structs.h"
#include "sl_pol_maps.h"
#include "sl_lb_structs.h"
#include "sl_event_maps.h"

/* A denial: the direction whose rules refused, the policy isolating the
 * pod there, and both identities. */
struct sl_pol_verdict {
	__u32 policy;
	__u32 dir;
	__u32 src_id;
	__u32 dst_id;
};

static __always_inline struct sl_pol_live *pol_ctl(void)
{
	__u32 zero = 0;
	struct sl_pol_live *c = bpf_map_lookup_elem(&sl_pol_ctl, &zero);
	if (!c || !c->enabled)
		return 0;
	return c;
}

static __always_inline int pol_loopback(const __u32 ip[4])
{
	if (ip[0] == 0 && ip[1] == 0 && ip[2] == bpf_htonl(0xffff))
		return (bpf_ntohl(ip[3]) >> 24) == 127;
	return ip[0] == 0 && ip[1] == 0 && ip[2] == 0 && ip[3] == bpf_htonl(1);
}

static __always_inline int pol_v4(const __u32 ip[4])
{
	return ip[0] == 0 && ip[1] == 0 && ip[2] == bpf_htonl(0xffff);
}

static __always_inline struct sl_pol_peer *pol_addr(__u32 bank, const __u32 ip[4])
{
	struct sl_pol_ip_key k = {.prefixlen = 32 + 128, .bank = bank};
	k.ip[0] = ip[0];
	k.ip[1] = ip[1];
	k.ip[2] = ip[2];
	k.ip[3] = ip[3];
	return bpf_map_lookup_elem(&sl_pol_ips, &k);
}

/* The local endpoint of the calling process: its cgroup, or the nearest
 * ancestor registered (a pod's containers live below the pod's cgroup). */
static __always_inline struct sl_pol_peer *pol_self(__u32 bank)
{
	struct sl_pol_cgroup_key k = {.cgroup = bpf_get_current_cgroup_id(), .bank = bank};
	struct sl_pol_peer *p = bpf_map_lookup_elem(&sl_pol_cgroups, &k);
	if (p)
		return p;
	for (int l = SL_POL_CGROUP_DEPTH - 1; l > 0; l--) {
		__u64 id = bpf_get_current_ancestor_cgroup_id(l);
		if (!id)
			continue;
		k.cgroup = id;
		p = bpf_map_lookup_elem(&sl_pol_cgroups, &k);
		if (p)
			return p;
	}
	return 0;
}

static __always_inline void pol_count(__u32 policy, int denied)
{
	struct sl_pol_count *c = bpf_map_lookup_elem(&sl_pol_stats, &policy);
	if (!c)
		return;
	if (denied)
		__sync_fetch_and_add(&c->denied, 1);
	else
		__sync_fetch_and_add(&c->allowed, 1);
}

/* The policy of the first rule of endpoint ep allowing class on proto and
 * port (host order), or 0. */
static __always_inline __u32 pol_rule(__u32 bank, __u32 ep, __u32 dir, __u32 class, __u8 proto, __u16 port)
{
	struct sl_pol_rule_key k = {
		.prefixlen = SL_POL_RULE_PORT_BITS,
		.bank = bank,
		.ep = ep,
		.dir = dir,
		.class = class,
		.proto = proto,
		.port = {port >> 8, port & 0xff},
	};
	struct sl_pol_rule *r = bpf_map_lookup_elem(&sl_pol_rules, &k);
	if (r)
		return r->policy;
	k.class = SL_POL_CLASS_ANY;
	r = bpf_map_lookup_elem(&sl_pol_rules, &k);
	return r ? r->policy : 0;
}

/* Judges a flow from src (an endpoint of this node, or null: judged by
 * its address class src_class only) to dst (what the destination address
 * is, or null) on proto and port. Returns 0 to allow, -1 to deny (v says
 * why). */
static __always_inline int pol_judge(__u32 bank, const struct sl_pol_peer *src, __u32 src_class, __u32 src_id,
				     const struct sl_pol_peer *dst, __u32 dst_class, __u8 proto, __u16 port,
				     struct sl_pol_verdict *v)
{
	__u32 p;
	v->src_id = src_id;
	v->dst_id = dst ? dst->identity : 0;
	if (src && src->ep && (src->flags & SL_POL_ISOLATED_EGRESS)) {
		p = pol_rule(bank, src->ep, SL_POL_EGRESS, dst_class, proto, port);
		if (!p) {
			v->policy = src->policy[SL_POL_EGRESS];
			v->dir = SL_POL_EGRESS;
			return -1;
		}
		pol_count(p, 0);
	}
	/* Traffic from the pod's own node is always let in. */
	if (dst && dst->ep && (dst->flags & SL_POL_ISOLATED_INGRESS) && src_id != SL_POL_IDENTITY_HOST) {
		p = pol_rule(bank, dst->ep, SL_POL_INGRESS, src_class, proto, port);
		if (!p) {
			v->policy = dst->policy[SL_POL_INGRESS];
			v->dir = SL_POL_INGRESS;
			return -1;
		}
		pol_count(p, 0);
	}
	return 0;
}

/* Reports a denial (src: the client's address if known, dst: the server). */
static __always_inline void pol_event(void *ctx, const struct sl_pol_verdict *v, const __u32 *src, __u16 sport,
				      const __u32 *dst, __u16 dport, __u8 proto)
{
	int lost;
	pol_count(v->policy, 1);
	struct sl_event *e = event_reserve(&lost);
	if (!e)
		return;
	e->type = SL_EV_POLICY_DENIED;
	e->svc_id = v->policy;
	e->dir = v->dir;
	e->proto = proto;
	e->src_identity = v->src_id;
	e->dst_identity = v->dst_id;
	if (src) {
		e->src_ip[0] = src[0];
		e->src_ip[1] = src[1];
		e->src_ip[2] = src[2];
		e->src_ip[3] = src[3];
	}
	e->src_port = sport;
	e->dst_ip[0] = dst[0];
	e->dst_ip[1] = dst[1];
	e->dst_ip[2] = dst[2];
	e->dst_ip[3] = dst[3];
	e->dst_port = dport;
	bpf_ringbuf_submit(e, 0);
}

/* The slot of a peer in its socket's exchange table, probe i. */
static __always_inline __u32 pol_reply_hash(const __u32 *ip, __u16 port)
{
	return ((ip[0] ^ ip[1] ^ ip[2] ^ ip[3] ^ port) * 0x9e3779b1) >> 16;
}

static __always_inline __u32 pol_reply_slot(const __u32 *ip, __u16 port, __u32 i)
{
	return (pol_reply_hash(ip, port) + i) & (SL_POL_SOCK_REPLIES - 1);
}

static __always_inline __u32 pol_more_slot(const __u32 *ip, __u16 port, __u32 i)
{
	return (pol_reply_hash(ip, port) + i) & (SL_POL_SOCK_MORE - 1);
}

static __always_inline int pol_reply_is(const struct sl_pol_reply_peer *p, const __u32 *ip, __u16 port, __u32 gen)
{
	return p->generation == gen && p->port == port && p->ip[0] == ip[0] && p->ip[1] == ip[1] &&
	       p->ip[2] == ip[2] && p->ip[3] == ip[3];
}

/* A slot a writer is filling in. Datagrams of one socket are let in on any
 * CPU, so two exchanges may be recorded in its table at once: a writer
 * takes a slot by a compare-and-swap of its generation to this value,
 * fills it in, then publishes the generation (an exchange written over
 * another's without that was lost at times: one answer in 160). */
#define SL_POL_REPLY_CLAIMED 0xffffffffu

/* The generation exchanges are recorded under: the live policy's low 32
 * bits, never the claim marker. */
static __always_inline __u32 pol_reply_gen(const struct sl_pol_live *ctl)
{
	__u32 gen = (__u32)ctl->generation;
	return gen == SL_POL_REPLY_CLAIMED ? gen - 1 : gen;
}

/* Takes slot p if it holds none of gen and no writer has it; with
 * replace, a slot of gen too (seen: what it held). 1 if taken. */
static __always_inline int pol_reply_claim(struct sl_pol_reply_peer *p, __u32 gen, int replace, __u32 *seen)
{
	__u32 g = p->generation;
	*seen = g;
	if (g == SL_POL_REPLY_CLAIMED || (g == gen && !replace))
		return 0;
	return __sync_val_compare_and_swap(&p->generation, g, SL_POL_REPLY_CLAIMED) == g;
}

/* Fills a claimed slot in, then publishes it (an atomic exchange: its
 * stores are visible before the generation is). */
static __always_inline void pol_reply_fill(struct sl_pol_reply_peer *p, const __u32 *ip, __u16 port, __u32 gen)
{
	p->ip[0] = ip[0];
	p->ip[1] = ip[1];
	p->ip[2] = ip[2];
	p->ip[3] = ip[3];
	p->port = port;
	__sync_lock_test_and_set(&p->generation, gen);
}

/* Charges owner n exchange tables within its quota (owner_udp_tables):
 * 1 if charged, else counted as refused. */
static __always_inline int pol_tables_charge(__u64 owner, __u32 n)
{
	struct sl_lb_owner *o = lb_owner(owner);
	if (o) {
		if (__sync_fetch_and_add(&o->udp_tables, n) + n <= sl_settings.owner_udp_tables)
			return 1;
		quota_return(&o->udp_tables, n);
		__sync_fetch_and_add(&o->udp_tables_refused, 1);
	}
	lb_count(SL_LB_POL_REPLIES_QUOTA);
	return 0;
}

/* Returns n exchange tables charged to owner. */
static __always_inline void pol_tables_uncharge(__u64 owner, __u32 n)
{
	struct sl_lb_owner *o = bpf_map_lookup_elem(&sl_lb_owners, &owner);
	if (o)
		quota_return(&o->udp_tables, n);
}

/* Returns what sk's exchange tables were charged (at its close). */
static __always_inline void pol_tables_release(struct bpf_sock *sk)
{
	struct sl_pol_replies *r = bpf_sk_storage_get(&sl_pol_replies, sk, 0, 0);
	if (!r || !r->charged)
		return;
	pol_tables_uncharge(r->owner, r->charged);
	r->charged = 0;
}

/* Moves an exchange out of sk's full table r into its overflow table
 * (made now if it has none, charged to r's owner): to a slot of an older
 * generation in the exchange's probe window, or else over one drawn at
 * random there, so that a socket's exchanges only ever push out its own.
 * 0 if the socket could not have one (its owner holds its quota of
 * tables, or its option memory is used up). */
static __always_inline int pol_reply_move(struct bpf_sock *sk, struct sl_pol_replies *r,
					  const struct sl_pol_reply_peer *old, __u32 gen)
{
	struct sl_pol_replies_more *m = bpf_sk_storage_get(&sl_pol_replies_more, sk, 0, 0);
	if (!m) {
		if (!pol_tables_charge(r->owner, SL_POL_MORE_CHARGE))
			return 0;
		m = bpf_sk_storage_get(&sl_pol_replies_more, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
		if (m) {
			__sync_fetch_and_add(&r->charged, SL_POL_MORE_CHARGE);
		} else {
			/* Made just now on another CPU (a create that loses the
			 * race gets none), or no memory left: one charge stays. */
			pol_tables_uncharge(r->owner, SL_POL_MORE_CHARGE);
			m = bpf_sk_storage_get(&sl_pol_replies_more, sk, 0, 0);
			if (!m)
				return 0;
		}
	}
	__u32 ip[4] = {old->ip[0], old->ip[1], old->ip[2], old->ip[3]};
	__u16 port = old->port;
	__u32 seen;
	for (__u32 i = 0; i < SL_POL_MORE_PROBES; i++) {
		struct sl_pol_reply_peer *p = &m->peers[pol_more_slot(ip, port, i)];
		if (pol_reply_claim(p, gen, 0, &seen)) {
			pol_reply_fill(p, ip, port, gen);
			return 1;
		}
	}
	for (__u32 i = 0; i < SL_POL_MORE_PROBES; i++) {
		struct sl_pol_reply_peer *p = &m->peers[pol_more_slot(ip, port, bpf_get_prandom_u32() & (SL_POL_MORE_PROBES - 1))];
		if (pol_reply_claim(p, gen, 1, &seen)) {
			pol_reply_fill(p, ip, port, gen);
			return 1;
		}
	}
	return 1; /* every slot of its window being written: lost */
}

/* An unconnected UDP socket's exchange with a peer, under the live
 * policy: answers either way are part of a flow already judged. Kept in
 * the socket's own table, made at its first exchange and charged to
 * owner (the socket's cgroup, or the sending process's); when a peer's
 * probe window is full of live exchanges, one of them (drawn at random)
 * moves to the socket's overflow table to make room. A socket whose owner
 * holds its quota of tables records nothing: answers to it are judged
 * as new flows. */
static __always_inline void pol_allow_replies(struct sl_pol_live *ctl, struct bpf_sock *sk, const __u32 *ip, __u16 port,
					      __u64 owner)
{
	if (!sk)
		return;
	struct sl_pol_replies *r = bpf_sk_storage_get(&sl_pol_replies, sk, 0, 0);
	if (!r) {
		if (!pol_tables_charge(owner, 1))
			return;
		r = bpf_sk_storage_get(&sl_pol_replies, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
		/* A first exchange of the same socket on another CPU may have
		 * made it just now (a create that loses the race gets none):
		 * one charge stays. */
		if (r && __sync_val_compare_and_swap(&r->charged, 0, 1) == 0) {
			r->owner = owner;
		} else {
			pol_tables_uncharge(owner, 1);
			if (!r)
				r = bpf_sk_storage_get(&sl_pol_replies, sk, 0, 0);
			if (!r)
				return;
		}
	}
	__u32 gen = pol_reply_gen(ctl);
	for (__u32 i = 0; i < SL_POL_REPLY_PROBES; i++) {
		if (pol_reply_is(&r->peers[pol_reply_slot(ip, port, i)], ip, port, gen))
			return;
	}
	__u32 seen;
	for (__u32 i = 0; i < SL_POL_REPLY_PROBES; i++) {
		struct sl_pol_reply_peer *p = &r->peers[pol_reply_slot(ip, port, i)];
		if (pol_reply_claim(p, gen, 0, &seen)) {
			pol_reply_fill(p, ip, port, gen);
			return;
		}
	}
	/* The window is full of live exchanges (or being written): one,
	 * drawn at random, moves to the overflow table. */
	for (__u32 i = 0; i < SL_POL_REPLY_PROBES; i++) {
		struct sl_pol_reply_peer *p = &r->peers[pol_reply_slot(ip, port, bpf_get_prandom_u32() & (SL_POL_REPLY_PROBES - 1))];
		if (!pol_reply_claim(p, gen, 1, &seen))
			continue;
		if (seen == gen && pol_reply_move(sk, r, p, gen)) {
			r->spilled = gen;
			lb_count(SL_LB_POL_REPLIES_SPILLED);
		}
		pol_reply_fill(p, ip, port, gen);
		return;
	}
}

static __always_inline int pol_is_reply(struct sl_pol_live *ctl, struct bpf_sock *sk, const __u32 *ip, __u16 port)
{
	if (!sk)
		return 0;
	struct sl_pol_replies *r = bpf_sk_storage_get(&sl_pol_replies, sk, 0, 0);
	if (!r)
		return 0;
	__u32 gen = pol_reply_gen(ctl);
	for (__u32 i = 0; i < SL_POL_REPLY_PROBES; i++) {
		if (pol_reply_is(&r->peers[pol_reply_slot(ip, port, i)], ip, port, gen))
			return 1;
	}
	/* A full window (this peer's, or an overlapping one) may have moved
	 * the exchange to the overflow: only sockets that spilled look there. */
	if (r->spilled != gen)
		return 0;
	struct sl_pol_replies_more *m = bpf_sk_storage_get(&sl_pol_replies_more, sk, 0, 0);
	if (!m)
		return 0;
	for (__u32 i = 0; i < SL_POL_MORE_PROBES; i++) {
		if (pol_reply_is(&m->peers[pol_more_slot(ip, port, i)], ip, port, gen))
			return 1;
	}
	return 0;
}

/* The connecting (or sending) process's flow to dst: 0 to go on, -1 if
 * denied (reported). unconnected: a UDP send with an address, which may
 * answer a datagram let in (judged then), and whose answers come back. */
static __always_inline int pol_connect(void *ctx, struct bpf_sock *sk, const struct sl_backend *dst, __u8 proto,
				       int unconnected, struct sl_pol_verdict *v)
{
	struct sl_pol_live *ctl = pol_ctl();
	if (!ctl || pol_loopback(dst->ip))
		return 0;
	__u32 bank = ctl->bank;
	if (unconnected) {
		if (pol_is_reply(ctl, sk, dst->ip, dst->port)) {
			lb_count(SL_LB_POL_REPLIES);
			return 0;
		}
	}
	struct sl_pol_peer *self = pol_self(bank);
	if (!self)
		return 0; /* not a pod's process: the server's first packet judges it */
	struct sl_pol_peer *peer = pol_addr(bank, dst->ip);
	__u32 self_class = pol_v4(dst->ip) ? self->class : self->class6;
	if (pol_judge(bank, self, self_class, self->identity, peer, peer ? peer->class : SL_POL_CLASS_WORLD, proto, dst->port, v))
		return -1;
	if (unconnected && (self->flags & SL_POL_ISOLATED_INGRESS))
		pol_allow_replies(ctl, sk, dst->ip, dst->port, bpf_get_current_cgroup_id());
	return 0;
}

#define SL_ETH_P_IP 0x0800
#define SL_ETH_P_IPV6 0x86DD
#define SL_TCP_SYN 0x02
#define SL_TCP_ACK 0x10

/* Reads the addresses, protocol and offset of the transport header of a
 * packet (network header at offset 0). Returns -1 for what is neither
 * IPv4 nor IPv6, or cannot be read. */
static __always_inline int pol_parse(struct __sk_buff *skb, __u32 src[4], __u32 dst[4], __u8 *proto, __u32 *l4)
{
	if (skb->protocol == bpf_htons(SL_ETH_P_IP)) {
		__u8 h[20];
		if (bpf_skb_load_bytes(skb, 0, h, sizeof(h)))
			return -1;
		*proto = h[9];
		*l4 = (h[0] & 0xf) * 4;
		src[0] = dst[0] = 0;
		src[1] = dst[1] = 0;
		src[2] = dst[2] = bpf_htonl(0xffff);
		__builtin_memcpy(&src[3], h + 12, 4);
		__builtin_memcpy(&dst[3], h + 16, 4);
		return 0;
	}
	if (skb->protocol != bpf_htons(SL_ETH_P_IPV6))
		return -1;
	__u8 h[40];
	if (bpf_skb_load_bytes(skb, 0, h, sizeof(h)))
		return -1;
	__builtin_memcpy(src, h + 8, 16);
	__builtin_memcpy(dst, h + 24, 16);
	__u8 next = h[6];
	__u32 off = 40;
	/* Extension headers before the transport header, a few at most. */
	for (int i = 0; i < 4; i++) {
		__u8 ext[2];
		if (next != 0 && next != 43 && next != 60 && next != 44)
			break;
		if (bpf_skb_load_bytes(skb, off, ext, sizeof(ext)))
			return -1;
		off += next == 44 ? 8 : ((__u32)ext[1] + 1) * 8;
		next = ext[0];
	}
	*proto = next;
	*l4 = off;
	return 0;
}

/* Judges the first packet of a flow into endpoint to, which is isolated
 * for ingress: returns 1 to let it in, 0 to drop it (counted, reported). */
static __always_inline int pol_first_packet(struct __sk_buff *skb, struct sl_pol_live *ctl, struct sl_pol_peer *to,
					    __u32 *src, __u16 sport, __u32 *dst, __u16 dport, __u8 proto)
{
	lb_count(SL_LB_POL_FIRST_PACKET);
	struct sl_pol_peer *from = pol_addr(ctl->bank, src);
	struct sl_pol_verdict v = {};
	/* Judged by address: a pod of this node was judged at its connect
	 * too, by the same tables. */
	if (!pol_judge(ctl->bank, 0, from ? from->class : SL_POL_CLASS_WORLD,
		       from ? from->identity : SL_POL_IDENTITY_WORLD, to, to->class, proto, dport, &v))
		return 1;
	lb_count(SL_LB_POL_DENIED_PACKET);
	pol_event(skb, &v, src, sport, dst, dport, proto);
	return 0;
}

#endif
