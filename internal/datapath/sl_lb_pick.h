/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: which backend a connection to a Service gets: the members it may
 * use, Maglev, session affinity (sl_svc_affinity, charged to its owner within
 * its quota), and the counters and events of each choice. */
#ifndef SL_LB_PICK_H
#define SL_LB_PICK_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "sl_lb_structs.h"
#include "sl_lb_maps.h"
#include "sl_event_maps.h"

static __always_inline int same_be(const struct sl_backend *a, const struct sl_backend *b)
{
	return a->ip[0] == b->ip[0] && a->ip[1] == b->ip[1] && a->ip[2] == b->ip[2] &&
	       a->ip[3] == b->ip[3] && a->port == b->port;
}

static __always_inline void count_selected(__u32 id, const struct sl_backend *be)
{
	struct sl_member_key mk = {.id = id, .be = *be};
	__u64 *n = bpf_map_lookup_elem(&sl_svc_selected, &mk);
	if (n)
		__sync_fetch_and_add(n, 1);
	lb_count(SL_LB_SELECTED);
}

/* Whether be still serves frontend id for a new choice: ready, or
 * terminating while nothing is ready. */
static __always_inline int member_usable(__u32 id, const struct sl_backend *be, const struct sl_svc_val *svc)
{
	struct sl_member_key mk = {.id = id, .be = *be};
	struct sl_member *m = bpf_map_lookup_elem(&sl_svc_members, &mk);
	if (!m)
		return 0;
	if (m->state == SL_MEMBER_READY)
		return 1;
	return m->state == SL_MEMBER_TERMINATING && svc->ready == 0;
}

/* Emits a load balancer event (src: the address asked for, dst: the
 * backend) if a reader listens. */
static __always_inline void lb_event(void *ctx, __u32 type, __u32 id, const struct sl_backend *vip,
				     const struct sl_backend *be, __u32 proto)
{
	int lost;
	struct sl_event *e = event_reserve(&lost);
	if (!e) {
		if (lost)
			lb_count(SL_LB_EVENTS_LOST);
		return;
	}
	e->type = type;
	e->svc_id = id;
	e->proto = proto;
	e->netns = bpf_get_netns_cookie(ctx);
	e->src_ip[0] = vip->ip[0];
	e->src_ip[1] = vip->ip[1];
	e->src_ip[2] = vip->ip[2];
	e->src_ip[3] = vip->ip[3];
	e->src_port = vip->port;
	if (be) {
		e->dst_ip[0] = be->ip[0];
		e->dst_ip[1] = be->ip[1];
		e->dst_ip[2] = be->ip[2];
		e->dst_ip[3] = be->ip[3];
		e->dst_port = be->port;
	}
	bpf_ringbuf_submit(e, 0);
}

/* The functions on a socket's translations are global (verified once, on
 * their own): their loops over SL_LB_SOCK_NATS entries would otherwise be
 * explored again inside every loop of their callers. */

/* Whether be already answers for another VIP of the socket: a reply from
 * it could then not be told apart. */
__noinline int sl_nat_ambiguous(const struct sl_lb_sock *st, const struct sl_backend *vip, const struct sl_backend *be)
{
	if (!st || !vip || !be)
		return 0;
	for (int i = 0; i < SL_LB_SOCK_NATS; i++) {
		if (st->nat[i].be.port && same_be(&st->nat[i].be, be) && !same_be(&st->nat[i].vip, vip))
			return 1;
	}
	return 0;
}

/* Charges owner one sl_lb_conns entry within its quota. */
static __always_inline int lb_owner_charge(__u64 owner)
{
	struct sl_lb_owner *o = lb_owner(owner);
	if (!o)
		return 0;
	if (__sync_fetch_and_add(&o->conns, 1) < sl_settings.owner_lb_conns)
		return 1;
	__sync_fetch_and_add(&o->conns, -1);
	__sync_fetch_and_add(&o->refused, 1);
	return 0;
}

/* Records the backend a client namespace was given. An entry that exists
 * (expired, or its backend no longer chosen) is replaced and stays
 * charged to owner, who made it; a new one is charged to the connecting
 * process's cgroup within its quota, else not made (the connect goes on,
 * without affinity; SL_LB_AFFINITY_QUOTA). */
static __always_inline void affinity_record(const struct sl_affinity_key *ak, const struct sl_backend *be, __u64 now,
					    __u64 owner)
{
	struct sl_affinity a = {.be = *be, .last_ns = now, .owner = owner};
	if (owner && bpf_map_update_elem(&sl_svc_affinity, ak, &a, BPF_EXIST) == 0)
		return;
	a.owner = bpf_get_current_cgroup_id();
	struct sl_lb_owner *o = lb_owner(a.owner);
	if (!o) {
		lb_count(SL_LB_AFFINITY_QUOTA);
		return;
	}
	if (__sync_fetch_and_add(&o->affinity, 1) >= sl_settings.owner_affinity) {
		__sync_fetch_and_add(&o->affinity, -1);
		__sync_fetch_and_add(&o->affinity_refused, 1);
		lb_count(SL_LB_AFFINITY_QUOTA);
		return;
	}
	if (bpf_map_update_elem(&sl_svc_affinity, ak, &a, BPF_NOEXIST)) {
		/* Full, or made by a racing connect of the same namespace. */
		owner_release(&o->affinity);
		lb_count(SL_LB_AFFINITY_QUOTA);
	}
}

/* A 64-bit mix (splitmix64's finalizer). */
static __always_inline __u64 mix64(__u64 x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

/* The ready backend the frontend's Maglev table gives the caller's network
 * namespace, or 0 (no table for the live bank: an apply is switching it;
 * the random pick reads the frontend again). */
static __always_inline struct sl_backend *maglev_pick(void *ctx, const struct sl_svc_val *svc)
{
	struct sl_maglev_key mk = {.id = svc->id, .bank = svc->bank};
	struct sl_maglev *t = bpf_map_lookup_elem(&sl_svc_maglev, &mk);
	if (!t)
		return 0;
	__u32 i = mix64(bpf_get_netns_cookie(ctx) ^ ((__u64)svc->id << 32)) % SL_MAGLEV_SIZE;
	/* The verifier does not bound a remainder: a check the compiler
	 * cannot drop as always false. */
	asm volatile("" : "+r"(i));
	if (i >= SL_MAGLEV_SIZE)
		return 0;
	__u32 slot = t->slot[i];
	if (slot >= svc->ready)
		return 0;
	struct sl_backend_key bk = {.id = svc->id, .slot = ((__u32)svc->bank << SL_BANK_SHIFT) | slot};
	return bpf_map_lookup_elem(&sl_svc_backends, &bk);
}

/* The slots pick tries in one bank: SL_LB_PICK_TRIES of the n from
 * base, starting first slots in. */
struct sl_slot_try {
	__u32 id;
	__u32 bank_bits; /* the bank, shifted into the slot number */
	__u32 base;
	__u32 n;
	__u32 first;
};

/* The slot pick takes in one bank: the first tried whose backend does not
 * already answer for another VIP of the socket (a UDP socket's
 * translations, sl_nat_ambiguous), or the last tried if all do; -1 if a
 * slot is gone (an apply published a new set). A global function: the
 * verifier checks its loop once, not again in each of pick's bank retries
 * and paths. The socket's storage is looked up here, since a global
 * function takes no pointer that may be null. */
__noinline int lb_try_slots(struct bpf_sock_addr *ctx, const struct sl_backend *vip, const struct sl_slot_try *tr)
{
	if (!ctx || !vip || !tr)
		return -1;
	__u32 n = tr->n;
	if (!n)
		return -1;
	struct sl_lb_sock *st = 0;
	struct bpf_sock *sk = ctx->sk;
	if (sk && ctx->protocol == IPPROTO_UDP)
		st = bpf_sk_storage_get(&sl_lb_sk, sk, 0, 0);
	struct sl_backend_key bk = {.id = tr->id};
	for (__u32 t = 0; t < SL_LB_PICK_TRIES; t++) {
		bk.slot = tr->bank_bits | (tr->base + (tr->first + t) % n);
		struct sl_backend *b = bpf_map_lookup_elem(&sl_svc_backends, &bk);
		if (!b)
			return -1;
		if (!st || !sl_nat_ambiguous(st, vip, b))
			return bk.slot;
		if (t + 1 == SL_LB_PICK_TRIES || t + 1 == n) {
			lb_count(SL_LB_PICK_AMBIGUOUS);
			return bk.slot;
		}
	}
	return -1;
}

/* Picks a backend of the frontend k (looked up as svc). Returns 1 and
 * fills be, or -1 if it has no usable backend. For a UDP socket, a backend
 * that already answers for another of its VIPs (its translations) is
 * avoided when another one can be had (lb_try_slots). */
static __always_inline int pick(struct bpf_sock_addr *ctx, const struct sl_svc_key *k, const struct sl_svc_val *svc,
				struct sl_backend *be, const struct sl_backend *prefer, const struct sl_backend *vip)
{
	__u32 id = svc->id;

	/* The backend this socket already talks to (unconnected UDP). */
	if (prefer && member_usable(id, prefer, svc)) {
		*be = *prefer;
		count_selected(id, be);
		return 1;
	}

	struct sl_affinity_key ak = {};
	__u64 now = 0, owner = 0;
	if (svc->affinity_s) {
		ak.netns = bpf_get_netns_cookie(ctx);
		ak.id = id;
		now = bpf_ktime_get_ns();
		struct sl_affinity *a = bpf_map_lookup_elem(&sl_svc_affinity, &ak);
		if (a && now - a->last_ns < (__u64)svc->affinity_s * 1000000000ull &&
		    member_usable(id, &a->be, svc)) {
			a->last_ns = now;
			*be = a->be;
			lb_count(SL_LB_AFFINITY_HITS);
			count_selected(id, be);
			return 1;
		}
		/* Expired, or its backend no longer chosen: the entry is
		 * replaced below, still charged to the one who made it. */
		if (a)
			owner = a->owner;
	}

	struct sl_backend *b = 0;
	int terminating = 0;
	if ((svc->flags & SL_SVC_MAGLEV) && svc->ready)
		b = maglev_pick(ctx, svc);
	for (int r = 0; r <= SL_LB_BANK_RETRIES && svc && !b; r++) {
		__u32 base = 0, n = svc->ready;
		if (n == 0) {
			base = svc->ready;
			n = svc->terminating;
		}
		if (n == 0)
			break;
		terminating = svc->ready == 0;
		struct sl_slot_try tr = {.id = id, .bank_bits = (__u32)svc->bank << SL_BANK_SHIFT, .base = base, .n = n,
					 .first = bpf_get_prandom_u32() % n};
		int slot = lb_try_slots(ctx, vip, &tr);
		if (slot >= 0) {
			struct sl_backend_key bk = {.id = id, .slot = slot};
			b = bpf_map_lookup_elem(&sl_svc_backends, &bk);
		}
		if (b)
			break;
		/* The slot is gone: an apply published a new set since svc
		 * was read. Read the frontend again. */
		lb_count(SL_LB_BANK_RETRY);
		svc = bpf_map_lookup_elem(&sl_svc, k);
	}
	if (!b) {
		lb_count(SL_LB_NO_BACKEND);
		__u64 *r = bpf_map_lookup_elem(&sl_svc_refused, &id);
		if (r)
			__sync_fetch_and_add(r, 1);
		return -1;
	}
	if (terminating)
		lb_count(SL_LB_TERMINATING_USED);
	*be = *b;
	if (ak.id)
		affinity_record(&ak, b, now, owner);
	count_selected(id, be);
	return 1;
}

/* An entry's age for sl_nat_remember: when it was last used, or 0 if it
 * is free (port 0). Computed without a branch: (port + 0xffff) >> 16 is
 * 1 for any port but 0. */
static __always_inline __u32 nat_age(const struct sl_nat *n)
{
	__u64 used = (__u64)n->vip.port + 0xffff;
	used >>= 16;
	/* Kept from being turned back into a branch. */
	asm volatile("" : "+r"(used));
	return n->used & (__u32)(0 - used);
}

/* min(a, b) without a branch: (a - b) >> 63 is 1 where a < b, as 64-bit
 * numbers of 32-bit values. */
static __always_inline __u32 min_u32(__u32 a, __u32 b)
{
	__u64 d = (__u64)a - (__u64)b;
	__u64 lt = d >> 63;
	asm volatile("" : "+r"(lt));
	return b + (__u32)(d & (0 - lt));
}

/* Remembers vip -> be in st: the entry for the same vip, or else a free
 * one, or else the least recently used one, is replaced. Returns 1 if a
 * translation of another VIP was dropped. */
__noinline int sl_nat_remember(struct sl_lb_sock *st, const struct sl_backend *vip, const struct sl_backend *be)
{
	if (!st || !vip || !be)
		return 0;
	/* Three passes, none carrying an index from one iteration to the
	 * next (an index kept across the loop multiplies the states the
	 * verifier explores: each program that calls this took ~450k
	 * instructions and a second to verify, far longer under emulation).
	 * The entry already held for vip is refreshed in place; else the
	 * oldest age is found, then the first entry of that age replaced. */
	for (int i = 0; i < SL_LB_SOCK_NATS; i++) {
		if (same_be(&st->nat[i].vip, vip)) {
			st->nat[i].be = *be;
			st->nat[i].used = ++st->clock;
			return 0;
		}
	}
	/* Free entries (port 0) count as the oldest. The minimum is taken
	 * without a branch (nat_age, min_u32): a branch per entry made the
	 * verifier walk both ways of each, 9,000 of the 30,000 instructions
	 * it processed for each program that calls this. */
	__u32 oldest = 0xffffffff;
	for (int i = 0; i < SL_LB_SOCK_NATS; i++)
		oldest = min_u32(oldest, nat_age(&st->nat[i]));
	for (int i = 0; i < SL_LB_SOCK_NATS; i++) {
		if (nat_age(&st->nat[i]) == oldest) {
			int evicted = st->nat[i].vip.port != 0;
			st->nat[i].vip = *vip;
			st->nat[i].be = *be;
			st->nat[i].used = ++st->clock;
			return evicted;
		}
	}
	return 0;
}

/* The backend st holds for vip, if any. */
__noinline int sl_nat_find(const struct sl_lb_sock *st, const struct sl_backend *vip, struct sl_backend *be)
{
	if (!st || !vip || !be)
		return 0;
	for (int i = 0; i < SL_LB_SOCK_NATS; i++) {
		if (same_be(&st->nat[i].vip, vip)) {
			*be = st->nat[i].be;
			return 1;
		}
	}
	return 0;
}

/* Turns a backend address back into the VIP the socket asked for: of the
 * VIPs that backend answers for on this socket (more than one only when
 * no other backend could be picked), the one sent to last. */
__noinline int sl_nat_reverse(const struct sl_lb_sock *st, struct sl_backend *addr)
{
	if (!st || !addr)
		return 0;
	/* Two passes, keeping no index across iterations: the newest use of
	 * the address, then its VIP. */
	__u32 newest = 0;
	int found = 0;
	for (int i = 0; i < SL_LB_SOCK_NATS; i++) {
		if (st->nat[i].be.port && same_be(&st->nat[i].be, addr)) {
			found = 1;
			if (st->nat[i].used > newest)
				newest = st->nat[i].used;
		}
	}
	if (!found)
		return 0;
	for (int i = 0; i < SL_LB_SOCK_NATS; i++) {
		if (st->nat[i].used == newest && st->nat[i].be.port && same_be(&st->nat[i].be, addr)) {
			*addr = st->nat[i].vip;
			return 1;
		}
	}
	return 0;
}

#endif /* SL_LB_PICK_H */
