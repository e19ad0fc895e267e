//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * socklane service load balancer: a socket that connects to (or, for
 * unconnected UDP, sends to) a service's virtual IP and port gets a backend
 * chosen once, in the socket layer: no per-packet NAT, no conntrack.
 *
 * connect4/6   TCP and connected UDP: VIP:port -> backend:targetPort.
 * sendmsg4/6   unconnected UDP, the same, remembered per socket.
 * recvmsg4/6   replies from a remembered backend appear to come from the VIP.
 * getpeername4/6  a translated socket's peer is the VIP it asked for.
 * sock_release    forgets a connected socket recorded by connect4/6.
 * cgroup_skb/ingress  network policy on the first packet of a flow into
 *                 a pod (sl_policy.h decides; connect4/6 and sendmsg4/6
 *                 judge egress after translation).
 *
 * Every hook runs for every socket of the attached cgroups, so the common
 * case (not a service address) is one hash lookup that misses.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "sl_consts.h"
#include "sl_lb_structs.h"
#include "sl_config_structs.h"
#include "sl_lb_maps.h"
#include "sl_event_maps.h"
#include "sl_kernel.h"

/* The load-time settings, as bypass.c has them (the loader writes both
 * from one value); the load balancer and the policy read their owner
 * quotas. */
const volatile struct sl_config sl_settings = SL_SETTINGS_DEFAULT;

#include "sl_policy.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Keeps the enums in BTF so that the Go side gets their names generated. */
struct sl_lb_enums {
	enum sl_lb_counter counter;
	enum sl_member_state state;
	enum sl_svc_flag svc_flag;
	struct sl_lb_forget_args forget;
	struct sl_lb_affinity_args affinity;
	enum sl_lb_layout layout;
	enum sl_pol_limits pol_limits;
	enum sl_pol_class pol_class;
	enum sl_pol_identity pol_identity;
	enum sl_pol_dir pol_dir;
	enum sl_pol_flag pol_flag;
	enum sl_pol_rule_bits pol_bits;
	enum sl_pod_limits pod_limits;
};
const struct sl_lb_enums *sl_lb_enums_unused __attribute__((unused));

#define SL_ECONNREFUSED 111
#define SL_EPERM 1

#include "sl_lb_pick.h"

static __always_inline void remember(struct bpf_sock *sk, const struct sl_backend *vip, const struct sl_backend *be)
{
	struct sl_lb_sock *st = bpf_sk_storage_get(&sl_lb_sk, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st) {
		lb_count(SL_LB_ERR_STORAGE);
		return;
	}
	if (sl_nat_remember(st, vip, be))
		lb_count(SL_LB_NAT_EVICTED);
}

static __always_inline int remembered(struct bpf_sock *sk, const struct sl_backend *vip, struct sl_backend *be)
{
	return sl_nat_find(bpf_sk_storage_get(&sl_lb_sk, sk, 0, 0), vip, be);
}

static __always_inline int reverse(struct bpf_sock *sk, struct sl_backend *addr)
{
	return sl_nat_reverse(bpf_sk_storage_get(&sl_lb_sk, sk, 0, 0), addr);
}

/* Records a connected socket's VIP and backend, so that getpeername can
 * answer with the VIP and the agent can destroy the socket when the
 * backend is removed. A new entry is charged to the connecting process's
 * cgroup: one pod cannot fill the table others' sockets are recorded in. */
static __always_inline int track(struct bpf_sock_addr *ctx, __u32 id, const struct sl_backend *vip,
				 const struct sl_backend *be, __u32 proto)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct sl_lb_conn *old = bpf_map_lookup_elem(&sl_lb_conns, &cookie);
	__u64 owner = old ? old->owner : bpf_get_current_cgroup_id();
	if (!old && !lb_owner_charge(owner)) {
		lb_count(SL_LB_QUOTA);
		return 0;
	}
	struct sl_lb_conn c = {
		.member = {.id = id, .be = *be},
		.vip = *vip,
		.netns = bpf_get_netns_cookie(ctx),
		.owner = owner,
		.proto = proto,
	};
	if (bpf_map_update_elem(&sl_lb_conns, &cookie, &c, BPF_ANY) == 0) {
		lb_count(SL_LB_CONNS_TRACKED);
		return 1;
	}
	if (!old)
		lb_owner_release(owner);
	lb_count(SL_LB_ERR_CONNS);
	return 0;
}

/* Forgets one recorded socket and returns its owner's charge. */
static __always_inline int forget(__u64 cookie)
{
	struct sl_lb_conn *c = bpf_map_lookup_elem(&sl_lb_conns, &cookie);
	if (!c)
		return 0;
	__u64 owner = c->owner;
	if (bpf_map_delete_elem(&sl_lb_conns, &cookie))
		return 0;
	lb_owner_release(owner);
	return 1;
}

static __always_inline void from4(struct bpf_sock_addr *ctx, struct sl_backend *a)
{
	a->ip[0] = 0;
	a->ip[1] = 0;
	a->ip[2] = bpf_htonl(0xffff);
	a->ip[3] = ctx->user_ip4;
	a->port = bpf_ntohs((__u16)ctx->user_port);
	a->pad = 0;
}

static __always_inline void to4(struct bpf_sock_addr *ctx, const struct sl_backend *a)
{
	ctx->user_ip4 = a->ip[3];
	ctx->user_port = bpf_htons(a->port);
}

static __always_inline void from6(struct bpf_sock_addr *ctx, struct sl_backend *a)
{
	a->ip[0] = ctx->user_ip6[0];
	a->ip[1] = ctx->user_ip6[1];
	a->ip[2] = ctx->user_ip6[2];
	a->ip[3] = ctx->user_ip6[3];
	a->port = bpf_ntohs((__u16)ctx->user_port);
	a->pad = 0;
}

static __always_inline void to6(struct bpf_sock_addr *ctx, const struct sl_backend *a)
{
	ctx->user_ip6[0] = a->ip[0];
	ctx->user_ip6[1] = a->ip[1];
	ctx->user_ip6[2] = a->ip[2];
	ctx->user_ip6[3] = a->ip[3];
	ctx->user_port = bpf_htons(a->port);
}

static __always_inline void key_of(const struct sl_backend *vip, __u32 proto, struct sl_svc_key *k)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->ip[0] = vip->ip[0];
	k->ip[1] = vip->ip[1];
	k->ip[2] = vip->ip[2];
	k->ip[3] = vip->ip[3];
	k->port = vip->port;
	k->proto = proto;
}

/* A connect or send that network policy denies: EPERM at once. */
static __always_inline int pol_refuse(struct bpf_sock_addr *ctx, const struct sl_pol_verdict *v,
				      const struct sl_backend *dst, __u32 proto)
{
	lb_count(SL_LB_POL_DENIED_CONNECT);
	pol_event(ctx, v, 0, 0, dst->ip, dst->port, proto);
	bpf_set_retval(-SL_EPERM);
	return 0;
}

/* Whether the load balancer translates for this socket: not in host-only
 * mode outside the host's network namespace, nor in a namespace opted out. */
static __always_inline int in_scope(struct bpf_sock_addr *ctx)
{
	__u64 netns = bpf_get_netns_cookie(ctx);
	if (sl_settings.lb_host_only == SL_MODE_ON)
		return netns == sl_settings.host_netns;
	return !bpf_map_lookup_elem(&sl_lb_optout, &netns);
}

/* pol_connect for translate, as a global function: the verifier checks it
 * once, on its own, instead of at each of translate's paths that reach
 * it (before and after a pick, for each protocol and address family). */
__noinline int lb_pol_connect(struct bpf_sock_addr *ctx, const struct sl_backend *dst, __u32 proto, __u32 unconnected,
			      struct sl_pol_verdict *v)
{
	if (!ctx || !dst || !v)
		return 0;
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return 0;
	return pol_connect(ctx, sk, dst, proto, unconnected, v);
}

/* connect() and unconnected sends: returns the program's verdict. */
static __always_inline int translate(struct bpf_sock_addr *ctx, int v6, int connected)
{
	__u32 proto = ctx->protocol;
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 1;
	struct sl_backend vip, be = {}, prev = {};
	if (v6)
		from6(ctx, &vip);
	else
		from4(ctx, &vip);
	struct sl_svc_key k;
	key_of(&vip, proto, &k);
	struct sl_svc_val *svc = bpf_map_lookup_elem(&sl_svc, &k);
	struct sl_pol_verdict pv = {};
	if (!svc) {
		/* Not a service: the common case. */
		if (lb_pol_connect(ctx, &vip, proto, !connected, &pv))
			return pol_refuse(ctx, &pv, &vip, proto);
		return 1;
	}
	if (!in_scope(ctx)) {
		/* The node's per-packet proxy translates it, and its
		 * policy enforcement judges the backend it picks: socklane
		 * cannot name it here. Ingress into pods of this node is
		 * still judged on the first packet. */
		lb_count(SL_LB_OUT_OF_SCOPE);
		return 1;
	}
	int have_prev = !connected && remembered(ctx->sk, &vip, &prev);
	if (pick(ctx, &k, svc, &be, have_prev ? &prev : 0, &vip) < 0) {
		lb_event(ctx, SL_EV_LB_REFUSED, svc->id, &vip, 0, proto);
		/* As kube-proxy's REJECT rule: connection refused, at once. */
		bpf_set_retval(-SL_ECONNREFUSED);
		return 0;
	}
	/* Egress is judged against the backend chosen, as Kubernetes does. */
	if (lb_pol_connect(ctx, &be, proto, !connected, &pv))
		return pol_refuse(ctx, &pv, &be, proto);
	if (v6)
		to6(ctx, &be);
	else
		to4(ctx, &be);
	/* A TCP socket's one translation lives in sl_lb_conns, which nothing
	 * evicts: creating socket storage cost more than the rest of this
	 * program. It is the fallback should the table be full. UDP keeps
	 * storage, where recvmsg turns every reply's source back. */
	if (proto == IPPROTO_UDP)
		remember(ctx->sk, &vip, &be);
	if (connected && !track(ctx, svc->id, &vip, &be, proto) && proto == IPPROTO_TCP)
		remember(ctx->sk, &vip, &be);
	if (!have_prev || !same_be(&prev, &be))
		lb_event(ctx, SL_EV_LB_SELECT, svc->id, &vip, &be, proto);
	return 1;
}

/* A translated TCP socket's VIP, if addr is still its backend. */
static __always_inline int reverse_tcp(struct bpf_sock_addr *ctx, struct sl_backend *addr)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct sl_lb_conn *c = bpf_map_lookup_elem(&sl_lb_conns, &cookie);
	if (!c || !same_be(&c->member.be, addr))
		return 0;
	*addr = c->vip;
	return 1;
}

static __always_inline int untranslate(struct bpf_sock_addr *ctx, int v6, enum sl_lb_counter c)
{
	struct sl_backend a;
	if (v6)
		from6(ctx, &a);
	else
		from4(ctx, &a);
	if (ctx->protocol == IPPROTO_TCP) {
		/* connect4/6 asked every socket it translated for its cookie:
		 * a socket without one (every accepted socket, at accept())
		 * was not translated. */
		if (!sock_has_cookie(ctx->sk))
			return 1;
		if (!reverse_tcp(ctx, &a) && !reverse(ctx->sk, &a))
			return 1;
	} else if (!reverse(ctx->sk, &a)) {
		return 1;
	}
	if (v6)
		to6(ctx, &a);
	else
		to4(ctx, &a);
	lb_count(c);
	return 1;
}

SEC("cgroup/connect4")
int sl_connect4(struct bpf_sock_addr *ctx) { return translate(ctx, 0, 1); }

SEC("cgroup/connect6")
int sl_connect6(struct bpf_sock_addr *ctx) { return translate(ctx, 1, 1); }

SEC("cgroup/sendmsg4")
int sl_sendmsg4(struct bpf_sock_addr *ctx) { return translate(ctx, 0, 0); }

SEC("cgroup/sendmsg6")
int sl_sendmsg6(struct bpf_sock_addr *ctx) { return translate(ctx, 1, 0); }

SEC("cgroup/recvmsg4")
int sl_recvmsg4(struct bpf_sock_addr *ctx) { return untranslate(ctx, 0, SL_LB_UDP_REVERSED); }

SEC("cgroup/recvmsg6")
int sl_recvmsg6(struct bpf_sock_addr *ctx) { return untranslate(ctx, 1, SL_LB_UDP_REVERSED); }

SEC("cgroup/getpeername4")
int sl_getpeername4(struct bpf_sock_addr *ctx) { return untranslate(ctx, 0, SL_LB_PEERNAME); }

SEC("cgroup/getpeername6")
int sl_getpeername6(struct bpf_sock_addr *ctx) { return untranslate(ctx, 1, SL_LB_PEERNAME); }

SEC("cgroup/sock_release")
int sl_sock_release(struct bpf_sock *sk)
{
	/* A translated UDP socket has load balancer storage (remember() runs
	 * before track()), a TCP one a cookie and an entry in sl_lb_conns.
	 * Every other socket leaves without creating a cookie, and at most
	 * one lookup, which takes no lock, instead of a delete in the shared
	 * table, which does. */
	__u64 cookie;
	if (sk->protocol == IPPROTO_TCP) {
		if (!sock_has_cookie(sk))
			return 1;
	} else {
		pol_tables_release(sk);
		if (!bpf_sk_storage_get(&sl_lb_sk, sk, 0, 0))
			return 1;
	}
	cookie = bpf_get_socket_cookie(sk);
	forget(cookie);
	return 1;
}

/* Run by the agent (BPF_PROG_TEST_RUN) for a recorded socket that closed
 * while its cgroup was detached. Returns 1 if it was forgotten. */
SEC("syscall")
int sl_lb_forget(struct sl_lb_forget_args *a)
{
	return forget(a->cookie);
}

/* Run by the agent for an affinity entry it found expired (or of a
 * frontend gone): removed, and its owner's charge returned, unless it was
 * used since the agent read it. Returns 1 if it was removed. */
SEC("syscall")
int sl_lb_affinity_expire(struct sl_lb_affinity_args *args)
{
	struct sl_affinity_key k = args->key;
	struct sl_affinity *a = bpf_map_lookup_elem(&sl_svc_affinity, &k);
	if (!a || a->last_ns != args->last_ns)
		return 0;
	__u64 owner = a->owner;
	if (bpf_map_delete_elem(&sl_svc_affinity, &k))
		return 0;
	struct sl_lb_owner *o = bpf_map_lookup_elem(&sl_lb_owners, &owner);
	if (o)
		owner_release(&o->affinity);
	return 1;
}

/* Network policy for flows into the pods of the attached cgroups: judged
 * on a TCP SYN and on a UDP flow's first datagram; every other packet
 * leaves after the flags are read. */
SEC("cgroup_skb/ingress")
int sl_pol_ingress(struct __sk_buff *skb)
{
	struct sl_pol_live *ctl = pol_ctl();
	if (!ctl)
		return 1;
	__u32 src[4], dst[4], l4 = 0;
	__u8 proto = 0;
	if (pol_parse(skb, src, dst, &proto, &l4))
		return 1;
	__u8 th[14];
	if (proto == IPPROTO_TCP) {
		if (bpf_skb_load_bytes(skb, l4, th, 14))
			return 1;
		if (!(th[13] & SL_TCP_SYN) || (th[13] & SL_TCP_ACK))
			return 1; /* established traffic, or an answer to our SYN */
	} else if (proto == IPPROTO_UDP) {
		if (bpf_skb_load_bytes(skb, l4, th, 4))
			return 1;
	} else {
		return 1;
	}
	__u16 sport = ((__u16)th[0] << 8) | th[1];
	__u16 dport = ((__u16)th[2] << 8) | th[3];
	if (pol_loopback(dst))
		return 1;
	__u32 bank = ctl->bank;
	if (proto == IPPROTO_TCP) {
		struct sl_pol_peer *to = pol_addr(bank, dst);
		if (!to || !to->ep || !(to->flags & SL_POL_ISOLATED_INGRESS))
			return 1;
		return pol_first_packet(skb, ctl, to, src, sport, dst, dport, proto);
	}
	/* UDP. A connected socket gets datagrams from its peer only: it
	 * chose that peer (judged at its connect). */
	struct bpf_sock *sk = skb->sk;
	if (sk) {
		sk = bpf_sk_fullsock(sk);
		if (sk && sk->dst_port)
			return 1;
	}
	struct sl_pol_flow_key fk = {.sport = sport, .dport = dport};
	__builtin_memcpy(fk.src, src, 16);
	__builtin_memcpy(fk.dst, dst, 16);
	struct sl_pol_flow *f = bpf_map_lookup_elem(&sl_pol_flows, &fk);
	if (f && f->generation == ctl->generation) {
		lb_count(SL_LB_POL_FLOW_HITS);
		return f->allow ? 1 : 0;
	}
	/* The flow's first datagram under this policy. */
	struct sl_pol_flow nf = {.generation = ctl->generation, .allow = 1};
	struct sl_pol_peer *to = pol_addr(bank, dst);
	if (to && to->ep) {
		if (pol_is_reply(ctl, sk, src, sport)) {
			lb_count(SL_LB_POL_REPLIES);
		} else {
			if (to->flags & SL_POL_ISOLATED_INGRESS)
				nf.allow = pol_first_packet(skb, ctl, to, src, sport, dst, dport, proto);
			/* The receiver may answer: its own egress and the
			 * sender's ingress do not apply to the answers. */
			if (nf.allow)
				pol_allow_replies(ctl, sk, src, sport, bpf_skb_cgroup_id(skb));
		}
	}
	bpf_map_update_elem(&sl_pol_flows, &fk, &nf, BPF_ANY);
	return nf.allow ? 1 : 0;
}
