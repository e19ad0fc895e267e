//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * socklane port virtualization: many copies of a program that binds a
 * fixed port, side by side in one network namespace.
 *
 * bind4/6         a workload's bind to one of its virtual ports gets a real
 *                 port of its pool, unique on the node (or the real port the
 *                 workload already holds for it: SO_REUSEPORT groups and
 *                 conflicts behave as they would on the port itself).
 * getsockname4/6  shows the virtual port (from the claim of the real one).
 * connect4/6,     a connect or send to a virtual port of this node reaches
 * sendmsg4/6      the caller's own copy, or the copy a route names.
 * getpeername4/6, and the peer shows the virtual port.
 * recvmsg4/6
 * sock_release    the last socket of a real port returns it to the pool.
 *
 * Attached only while rules exist, to the workloads' cgroups and the
 * datapath's own; a connect or send to a port no workload has costs one
 * hash lookup that misses.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "sl_consts.h"
#include "sl_pt_structs.h"
#include "sl_pt_maps.h"
#include "sl_event_maps.h"
#include "sl_kernel.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Keeps the enums in BTF so that the Go side gets their names generated. */
struct sl_pt_enums {
	enum sl_pt_limits limits;
	enum sl_pt_counter counter;
	enum sl_pt_flag flag;
	enum sl_pt_kind kind;
};
const struct sl_pt_enums *sl_pt_enums_unused __attribute__((unused));

#define SL_EADDRINUSE 98
#define SL_ECONNREFUSED 111

/* The workload of the calling process: its cgroup, or the nearest
 * ancestor registered (a pod's containers live below the pod's cgroup),
 * searched only at the levels workload cgroups are at. 0 for none. */
static __always_inline __u32 pt_workload(void)
{
	__u64 id = bpf_get_current_cgroup_id();
	__u32 *wl = bpf_map_lookup_elem(&sl_pt_cgroups, &id);
	if (wl)
		return *wl;
	__u32 zero = 0;
	struct sl_pt_levels *lv = bpf_map_lookup_elem(&sl_pt_cglevels, &zero);
	if (!lv)
		return 0;
	__u32 lo = lv->min, hi = lv->max;
	for (int i = 0; i < SL_PT_CGROUP_DEPTH; i++) {
		int l = (int)hi - i;
		if (l < (int)lo || l <= 0)
			break;
		id = bpf_get_current_ancestor_cgroup_id(l);
		if (!id)
			continue; /* below the caller's own level */
		wl = bpf_map_lookup_elem(&sl_pt_cgroups, &id);
		if (wl)
			return *wl;
	}
	return 0;
}

/* The protocol whose ports a socket uses: an MPTCP socket's are TCP's. */
static __always_inline __u8 pt_proto(__u32 protocol)
{
	return protocol == IPPROTO_MPTCP ? IPPROTO_TCP : (__u8)protocol;
}

static __always_inline int pt_in_pool(__u16 port)
{
	__u32 w = port >> 6;
	__u64 *bits = bpf_map_lookup_elem(&sl_pt_pool, &w);
	return bits && (*bits & (1ull << (port & 63)));
}

static __always_inline void pt_exhausted_event(void *ctx, __u32 wl, __u16 vport, __u8 proto)
{
	int lost;
	struct sl_event *e = event_reserve(&lost);
	if (!e)
		return;
	e->type = SL_EV_PORTS_EXHAUSTED;
	e->svc_id = wl;
	e->proto = proto;
	e->dst_port = vport;
	e->netns = bpf_get_netns_cookie(ctx);
	bpf_ringbuf_submit(e, 0);
}

struct pt_alloc {
	__u64 cookie;
	__u64 now;
	__u64 reuse_ns;
	__u64 netns;
	__u32 wl;
	__u32 start;
	__u32 n;
	__u16 lo;
	__u16 vport;
	__u16 got;
	__u8 proto;
	__u8 family;
};

static __always_inline void pt_fill(struct sl_pt_claim *c, const struct pt_alloc *a, __u8 direct)
{
	c->cookie = a->cookie;
	c->since_ns = a->now;
	c->freed_ns = 0;
	c->netns = a->netns;
	c->wl = a->wl;
	c->vport = a->vport;
	c->family = a->family;
	c->direct = direct;
}

/* Claims port for a: a port never handed out, or one released at least
 * reuse_ns ago (its last connections may still hold it in TIME_WAIT).
 * Returns 1 if claimed. */
static __always_inline int pt_claim(struct pt_alloc *a, __u16 port, __u8 direct)
{
	struct sl_pt_pkey k = {.port = port, .proto = a->proto};
	struct sl_pt_claim c = {.refs = 1};
	pt_fill(&c, a, direct);
	if (bpf_map_update_elem(&sl_pt_claims, &k, &c, BPF_NOEXIST) == 0)
		return 1;
	struct sl_pt_claim *old = bpf_map_lookup_elem(&sl_pt_claims, &k);
	if (!old || old->refs || (old->freed_ns && a->now - old->freed_ns < a->reuse_ns))
		return 0;
	if (__sync_val_compare_and_swap(&old->refs, 0, 1) != 0)
		return 0;
	pt_fill(old, a, direct);
	return 1;
}

static long pt_try(__u32 i, void *arg)
{
	struct pt_alloc *a = arg;
	if (!a->n)
		return 1;
	__u16 port = a->lo + (a->start + i) % a->n;
	if (pt_claim(a, port, 0)) {
		a->got = port;
		return 1;
	}
	return 0;
}

/* Takes one more reference on the real port wl holds for a virtual port,
 * if it still holds it. */
static __always_inline int pt_share(const struct sl_pt_vkey *vk, __u16 *real)
{
	__u32 *b = bpf_map_lookup_elem(&sl_pt_binds, vk);
	if (!b)
		return 0;
	struct sl_pt_pkey k = {.port = (__u16)*b, .proto = vk->proto};
	struct sl_pt_claim *c = bpf_map_lookup_elem(&sl_pt_claims, &k);
	if (!c || c->wl != vk->wl || c->vport != vk->port || c->direct)
		return 0;
	for (int t = 0; t < SL_PT_SHARE_TRIES; t++) {
		__u32 r = c->refs;
		if (!r)
			return 0;
		if (__sync_val_compare_and_swap(&c->refs, r, r + 1) == r) {
			*real = k.port;
			return 1;
		}
	}
	return 0;
}

/* Drops one reference on a real port; the last returns it to the pool,
 * resting there first (freed_ns set) if rest: a TCP socket that listened
 * or connected may leave connections in TIME_WAIT on it. */
static __always_inline void pt_unclaim(__u16 real, __u8 proto, __u32 wl, __u16 vport, int rest)
{
	struct sl_pt_pkey k = {.port = real, .proto = proto};
	struct sl_pt_claim *c = bpf_map_lookup_elem(&sl_pt_claims, &k);
	if (!c || c->wl != wl)
		return;
	for (int t = 0; t < SL_PT_SHARE_TRIES; t++) {
		__u32 r = c->refs;
		if (!r)
			return;
		if (r == 1)
			c->freed_ns = rest ? bpf_ktime_get_ns() : 0;
		if (__sync_val_compare_and_swap(&c->refs, r, r - 1) != r)
			continue;
		if (r == 1) {
			struct sl_pt_vkey vk = {.wl = wl, .port = vport, .proto = proto};
			__u32 *b = bpf_map_lookup_elem(&sl_pt_binds, &vk);
			if (b && *b == real)
				bpf_map_delete_elem(&sl_pt_binds, &vk);
			pt_count(wl, SL_PT_C_RELEASED);
		}
		return;
	}
}

/* A socket that binds again after a failed bind gives back what it held. */
static __always_inline void pt_forget_bound(struct sl_pt_sock *st, __u64 cookie)
{
	if (!(st->kind & SL_PT_K_BOUND) || st->cookie != cookie)
		return;
	pt_unclaim(st->real, st->proto, st->wl, st->vport, 0);
	st->kind &= ~SL_PT_K_BOUND;
	st->real = 0;
}

struct mptcp_sock;

/* The first subflow of an MPTCP socket binds for it, but is a kernel
 * socket, whose release runs no program: the MPTCP socket itself gets a
 * record of the reference (cookie 0: it never asked for one) and gives it
 * back at its own release, also after a bind that failed. */
static __always_inline void pt_mptcp_owner(struct bpf_sock_addr *ctx, __u32 wl, __u16 vport, __u16 real, __u8 proto)
{
	struct mptcp_sock *msk = bpf_skc_to_mptcp_sock(ctx->sk);
	if (!msk)
		return;
	struct sl_pt_sock *st = bpf_sk_storage_get(&sl_pt_sk, msk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st)
		return;
	st->cookie = 0;
	st->wl = wl;
	st->vport = vport;
	st->real = real;
	st->proto = proto;
	st->kind |= SL_PT_K_BOUND;
}

/* Records a reference held by a socket other than the claim's first (its
 * cookie is in the claim): socket storage, charged to the socket's owner.
 * Returns 0 if there is none to be had. */
static __always_inline int pt_record(struct bpf_sock_addr *ctx, __u64 cookie, __u32 wl, __u16 vport, __u16 real, __u8 proto)
{
	struct sl_pt_sock *st = bpf_sk_storage_get(&sl_pt_sk, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st)
		return 0;
	st->cookie = cookie;
	st->wl = wl;
	st->vport = vport;
	st->real = real;
	st->proto = proto;
	st->kind |= SL_PT_K_BOUND;
	return 1;
}

#define SL_ENOMEM 12

/* The common bind (the first socket of a real port) allocates nothing:
 * the claim names its socket by cookie, and its release finds the claim
 * by the socket's port. */
static __always_inline int pt_bind(struct bpf_sock_addr *ctx, __u8 family)
{
	__u8 proto = pt_proto(ctx->protocol);
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 1;
	__u16 port = bpf_ntohs((__u16)ctx->user_port);
	__u32 wl = pt_workload();
	struct sl_pt_vkey vk = {.wl = wl, .port = port, .proto = proto};
	struct sl_pt_rule *rule = wl ? bpf_map_lookup_elem(&sl_pt_vports, &vk) : 0;
	if (!rule && (!port || !pt_in_pool(port)))
		return 1;
	__u64 cookie = bpf_get_socket_cookie(ctx);
	/* A socket binding again after a bind the kernel refused gives
	 * back what it held (if it held it through storage; a first
	 * socket's claim is returned by the sweep). */
	struct sl_pt_sock *st = bpf_sk_storage_get(&sl_pt_sk, ctx->sk, 0, 0);
	if (st)
		pt_forget_bound(st, cookie);
	if (!rule) {
		/* A bind to a pool port itself: held, so that no pool hands
		 * it out; refused if another workload holds it (a copy's
		 * real port is not to be joined through SO_REUSEPORT). */
		struct sl_pt_pkey k = {.port = port, .proto = proto};
		struct sl_pt_claim *c = bpf_map_lookup_elem(&sl_pt_claims, &k);
		if (c && c->refs && c->wl != wl) {
			pt_count(wl, SL_PT_C_FOREIGN_BIND);
			bpf_set_retval(-SL_EADDRINUSE);
			return 0;
		}
		if (c && c->refs)
			return 1; /* its own: the kernel decides */
		struct pt_alloc a = {.cookie = cookie, .now = bpf_ktime_get_ns(),
				     .netns = bpf_get_netns_cookie(ctx), .wl = wl, .vport = port,
				     .proto = proto, .family = family};
		if (pt_claim(&a, port, 1)) {
			pt_mptcp_owner(ctx, wl, port, port, proto);
			pt_count(wl, SL_PT_C_DIRECT);
		}
		return 1;
	}
	__u16 real = 0;
	if (port && pt_share(&vk, &real)) {
		if (!pt_record(ctx, cookie, wl, port, real, proto)) {
			/* Without a record the reference could not be given
			 * back: refused, as a kernel short of memory would. */
			pt_unclaim(real, proto, wl, port, 0);
			bpf_set_retval(-SL_ENOMEM);
			return 0;
		}
		pt_count(wl, SL_PT_C_SHARED);
	} else {
		__u32 n = (__u32)rule->pool_hi - rule->pool_lo + 1;
		if (rule->pool_hi < rule->pool_lo || n > SL_PT_MAX_POOL)
			n = 0;
		struct pt_alloc a = {.cookie = cookie, .now = bpf_ktime_get_ns(),
				     .reuse_ns = (__u64)rule->reuse_ms * 1000000ull,
				     .netns = bpf_get_netns_cookie(ctx), .wl = wl,
				     .start = n ? bpf_get_prandom_u32() % n : 0, .n = n,
				     .lo = rule->pool_lo, .vport = port, .proto = proto, .family = family};
		bpf_loop(n, pt_try, &a, 0);
		if (!a.got) {
			pt_count(wl, SL_PT_C_EXHAUSTED);
			pt_exhausted_event(ctx, wl, port, proto);
			bpf_set_retval(-SL_EADDRINUSE);
			return 0;
		}
		real = a.got;
		if (port) {
			__u32 v = real;
			bpf_map_update_elem(&sl_pt_binds, &vk, &v, BPF_ANY);
		}
		pt_count(wl, SL_PT_C_BINDS);
	}
	pt_mptcp_owner(ctx, wl, port, real, proto);
	ctx->user_port = bpf_htons(real);
	return 1;
}

SEC("cgroup/bind4")
int sl_pt_bind4(struct bpf_sock_addr *ctx) { return pt_bind(ctx, AF_INET); }

SEC("cgroup/bind6")
int sl_pt_bind6(struct bpf_sock_addr *ctx) { return pt_bind(ctx, AF_INET6); }

/* The virtual port a real port of a pool shows (0: none, or not
 * virtualized). Only the workload that holds a real port has sockets
 * bound to it (a bind of another is refused), so a socket's own port is
 * answered from the claim without storage of its own: accepted sockets,
 * MPTCP sockets (bound through their first subflow) and sockets bound
 * before an agent restart alike. A peer's port likewise: a connect to a
 * virtual port went to the claim's real port. */
static __always_inline __u16 pt_claimed_vport(__u16 port, __u8 proto)
{
	if (!pt_in_pool(port))
		return 0;
	struct sl_pt_pkey k = {.port = port, .proto = proto};
	struct sl_pt_claim *c = bpf_map_lookup_elem(&sl_pt_claims, &k);
	if (!c || c->direct)
		return 0;
	return c->vport;
}

static __always_inline int pt_sockname(struct bpf_sock_addr *ctx)
{
	__u16 v = pt_claimed_vport(bpf_ntohs((__u16)ctx->user_port), pt_proto(ctx->protocol));
	if (v)
		ctx->user_port = bpf_htons(v);
	return 1;
}

SEC("cgroup/getsockname4")
int sl_pt_getsockname4(struct bpf_sock_addr *ctx) { return pt_sockname(ctx); }

SEC("cgroup/getsockname6")
int sl_pt_getsockname6(struct bpf_sock_addr *ctx) { return pt_sockname(ctx); }

/* Whether a destination is loopback or unspecified (IPv4 as
 * ::ffff:a.b.c.d). */
static __always_inline int pt_loopback(const struct sl_pt_addr *a)
{
	if (a->ip[0] || a->ip[1])
		return 0;
	if (a->ip[2] == bpf_htonl(0xffff)) {
		__u32 v4 = bpf_ntohl(a->ip[3]);
		return (v4 >> 24) == 127 || v4 == 0;
	}
	return !a->ip[2] && (a->ip[3] == bpf_htonl(1) || !a->ip[3]);
}

static __always_inline void pt_addr(struct bpf_sock_addr *ctx, int v6, struct sl_pt_addr *a)
{
	if (v6) {
		a->ip[0] = ctx->user_ip6[0];
		a->ip[1] = ctx->user_ip6[1];
		a->ip[2] = ctx->user_ip6[2];
		a->ip[3] = ctx->user_ip6[3];
	} else {
		a->ip[0] = 0;
		a->ip[1] = 0;
		a->ip[2] = bpf_htonl(0xffff);
		a->ip[3] = ctx->user_ip4;
	}
}

/* connect() and unconnected sends to a virtual port of this node. */
static __always_inline int pt_dest(struct bpf_sock_addr *ctx, int v6)
{
	__u8 proto = pt_proto(ctx->protocol);
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 1;
	__u16 port = bpf_ntohs((__u16)ctx->user_port);
	struct sl_pt_pkey ik = {.port = port, .proto = proto};
	struct sl_pt_index *idx = bpf_map_lookup_elem(&sl_pt_vindex, &ik);
	if (!idx || !port)
		return 1;
	struct sl_pt_addr a;
	pt_addr(ctx, v6, &a);
	/* A workload's address reaches its copy from anywhere; this node's
	 * addresses reach the caller's own copy, or the route's. */
	__u32 *named = pt_loopback(&a) ? 0 : bpf_map_lookup_elem(&sl_pt_addrs, &a);
	if (!named && !pt_loopback(&a))
		return 1;
	struct sl_pt_vkey vk = {.port = port, .proto = proto};
	enum sl_pt_counter how = SL_PT_C_ROUTED;
	if (named && *named) {
		vk.wl = *named;
		if (!bpf_map_lookup_elem(&sl_pt_vports, &vk))
			return 1; /* not one of its virtual ports */
	} else {
		vk.wl = pt_workload();
		if (vk.wl && bpf_map_lookup_elem(&sl_pt_vports, &vk)) {
			how = SL_PT_C_CONNECTS;
		} else {
			if (!idx->route)
				return 1; /* no copy is chosen for others: the port itself */
			vk.wl = idx->route;
		}
	}
	__u32 *b = bpf_map_lookup_elem(&sl_pt_binds, &vk);
	if (!b) {
		/* The copy is not listening: refused, as its port would be.
		 * Not left to the port itself, which any other pod of the
		 * namespace may hold for good (no copy needs it) to catch
		 * the copy's clients while it restarts. A copy that listened
		 * on the port itself before its rule existed has that port
		 * as its binding (written at apply). */
		pt_count(vk.wl, SL_PT_C_NOT_BOUND);
		bpf_set_retval(-SL_ECONNREFUSED);
		return 0;
	}
	__u16 real = (__u16)*b;
	/* The peer's port shows the virtual one from its claim; only an
	 * address asked for needs remembering, in socket storage. */
	struct sl_pt_sock *st = bpf_sk_storage_get(&sl_pt_sk, ctx->sk, 0, 0);
	if (st)
		st->kind &= ~SL_PT_K_PEER_ADDR;
	if (named && *named) {
		if (!st)
			st = bpf_sk_storage_get(&sl_pt_sk, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
		if (st) {
			st->peer_real = real;
			st->peer_addr[0] = a.ip[0];
			st->peer_addr[1] = a.ip[1];
			st->peer_addr[2] = a.ip[2];
			st->peer_addr[3] = a.ip[3];
			st->kind |= SL_PT_K_PEER_ADDR;
		}
		/* The copy listens on this node: reached over loopback. */
		if (!v6) {
			ctx->user_ip4 = bpf_htonl(0x7f000001);
		} else if (a.ip[2] == bpf_htonl(0xffff)) {
			ctx->user_ip6[0] = 0;
			ctx->user_ip6[1] = 0;
			ctx->user_ip6[2] = bpf_htonl(0xffff);
			ctx->user_ip6[3] = bpf_htonl(0x7f000001);
		} else {
			ctx->user_ip6[0] = 0;
			ctx->user_ip6[1] = 0;
			ctx->user_ip6[2] = 0;
			ctx->user_ip6[3] = bpf_htonl(1);
		}
	}
	ctx->user_port = bpf_htons(real);
	pt_count(vk.wl, how);
	return 1;
}

SEC("cgroup/connect4")
int sl_pt_connect4(struct bpf_sock_addr *ctx) { return pt_dest(ctx, 0); }

SEC("cgroup/connect6")
int sl_pt_connect6(struct bpf_sock_addr *ctx) { return pt_dest(ctx, 1); }

SEC("cgroup/sendmsg4")
int sl_pt_sendmsg4(struct bpf_sock_addr *ctx) { return pt_dest(ctx, 0); }

SEC("cgroup/sendmsg6")
int sl_pt_sendmsg6(struct bpf_sock_addr *ctx) { return pt_dest(ctx, 1); }

/* A peer reached through a virtual port shows that port. */
static __always_inline int pt_peer(struct bpf_sock_addr *ctx, int v6)
{
	__u16 port = bpf_ntohs((__u16)ctx->user_port);
	__u16 v = pt_claimed_vport(port, pt_proto(ctx->protocol));
	if (!v)
		return 1;
	ctx->user_port = bpf_htons(v);
	/* Reached through a workload's address: that address, not loopback. */
	struct sl_pt_sock *st = bpf_sk_storage_get(&sl_pt_sk, ctx->sk, 0, 0);
	if (!st || !(st->kind & SL_PT_K_PEER_ADDR) || st->peer_real != port)
		return 1;
	struct sl_pt_addr a;
	pt_addr(ctx, v6, &a);
	if (!pt_loopback(&a))
		return 1;
	if (v6) {
		ctx->user_ip6[0] = st->peer_addr[0];
		ctx->user_ip6[1] = st->peer_addr[1];
		ctx->user_ip6[2] = st->peer_addr[2];
		ctx->user_ip6[3] = st->peer_addr[3];
	} else {
		ctx->user_ip4 = st->peer_addr[3];
	}
	return 1;
}

SEC("cgroup/getpeername4")
int sl_pt_getpeername4(struct bpf_sock_addr *ctx) { return pt_peer(ctx, 0); }

SEC("cgroup/getpeername6")
int sl_pt_getpeername6(struct bpf_sock_addr *ctx) { return pt_peer(ctx, 1); }

SEC("cgroup/recvmsg4")
int sl_pt_recvmsg4(struct bpf_sock_addr *ctx) { return pt_peer(ctx, 0); }

SEC("cgroup/recvmsg6")
int sl_pt_recvmsg6(struct bpf_sock_addr *ctx) { return pt_peer(ctx, 1); }

SEC("cgroup/sock_release")
int sl_pt_release(struct bpf_sock *sk)
{
	/* Only a TCP socket that listened or connected leaves connections
	 * behind: one bound and closed (a program probing what the node
	 * offers) gives its port back at once. */
	int rest = sk->state != BPF_TCP_CLOSE || sk->dst_port;
	struct sl_pt_sock *st = bpf_sk_storage_get(&sl_pt_sk, sk, 0, 0);
	if (st) {
		/* A socket that shared a real port, or the MPTCP socket
		 * whose subflow bound (cookie 0). */
		if ((st->kind & SL_PT_K_BOUND) && (!st->cookie || bpf_get_socket_cookie(sk) == st->cookie))
			pt_unclaim(st->real, st->proto, st->wl, st->vport, rest && st->proto == IPPROTO_TCP);
		return 1;
	}
	/* The first socket of a claim: found by its port, told apart from
	 * the sockets accepted on it by its cookie (a socket that never
	 * asked for one did not bind through socklane). */
	if (!sock_has_cookie(sk))
		return 1;
	__u16 port = sock_local_port(sk);
	if (!port || !pt_in_pool(port))
		return 1;
	__u8 proto = pt_proto(sk->protocol);
	struct sl_pt_pkey k = {.port = port, .proto = proto};
	struct sl_pt_claim *c = bpf_map_lookup_elem(&sl_pt_claims, &k);
	if (!c || !c->refs)
		return 1;
	if (c->cookie != bpf_get_socket_cookie(sk)) {
		/* An MPTCP socket whose record could not be made at bind
		 * (pt_mptcp_owner): the one that bound is the listener, or
		 * one bound and never connected (an accepted one has a
		 * peer). */
		if (sk->protocol != IPPROTO_MPTCP || (sk->state != BPF_TCP_LISTEN && sk->dst_port))
			return 1;
	}
	pt_unclaim(port, proto, c->wl, c->vport, rest && proto == IPPROTO_TCP);
	return 1;
}
