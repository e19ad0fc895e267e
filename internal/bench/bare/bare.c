//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* socklane bench: the bare sockmap redirect, the reference socklane's
 * bypass is measured against. A sock_ops program puts both ends of every
 * established IPv4 TCP connection (IPv6 sockets with IPv4-mapped
 * addresses too: a dual-stack listener's, such as Go's on 0.0.0.0) in a
 * SOCKHASH keyed by the 4-tuple (and
 * the network namespace for loopback pairs, which only meet inside one);
 * an sk_msg program redirects every send to the peer's ingress queue.
 * Nothing else: no verdict windows, fallbacks, backlog rules, events or
 * accounting but the counters the bench reads to prove the path was
 * taken. A send whose peer is not in the map (not yet, or not local)
 * goes over TCP. Loaded and attached by the bench only, to the bench's
 * own pods, never by the agent.
 *
 * With a stream verdict (sl_bare_skb, the bench's --bare-stream-verdict)
 * the map also carries what socklane's valve puts on its own: an sk_skb
 * verdict that passes TCP's bytes into the psock's queue. Any such
 * verdict on a map makes its sockets read through the kernel's parser
 * receive path (tcp_bpf_recvmsg_parser) instead of tcp_bpf_recvmsg, so
 * the two redirects then differ by socklane's programs only. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define SL_BARE_AF_INET 2
#define SL_BARE_AF_INET6 10

/* One end of a connection as its own socket sees it. */
struct sl_bare_key {
	__u32 local_ip4;
	__u32 remote_ip4;
	__u32 local_port;              /* host byte order */
	__u32 remote_port;             /* host byte order */
	__u64 netns;                   /* the namespace of a loopback pair, else 0 */
};

enum sl_bare_counter {
	SL_BARE_REDIRECTED = 0,        /* sends redirected to the peer */
	SL_BARE_MISSED = 1,            /* sends with no peer in the map: TCP */
	SL_BARE_JOINED = 2,            /* sockets put in the map */
	SL_BARE_JOIN_FAILED = 3,       /* sockets the map refused */
	SL_BARE_SKB_PASSED = 4,        /* TCP segments the stream verdict passed */
	SL_BARE_COUNTERS = 5,
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, struct sl_bare_key);
	__type(value, __u64);
} sl_bare_socks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SL_BARE_COUNTERS);
	__type(key, enum sl_bare_counter);
	__type(value, __u64);
} sl_bare_counts SEC(".maps");

static __always_inline int loopback(__u32 ip4)
{
	return (bpf_ntohl(ip4) >> 24) == 127;
}

/* The IPv4 address of an IPv4 socket, or of an IPv6 socket's IPv4-mapped
 * address; 0 otherwise. */
static __always_inline __u32 ip4_of(__u32 family, __u32 ip4, const __u32 *ip6)
{
	if (family == SL_BARE_AF_INET)
		return ip4;
	if (family == SL_BARE_AF_INET6 && !ip6[0] && !ip6[1] && ip6[2] == bpf_htonl(0xffff))
		return ip6[3];
	return 0;
}

static __always_inline void count(enum sl_bare_counter which)
{
	__u64 *n = bpf_map_lookup_elem(&sl_bare_counts, &which);
	if (n)
		(*n)++;
}

SEC("sockops")
int sl_bare_sockops(struct bpf_sock_ops *skops)
{
	if (skops->op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB && skops->op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		return 1;
	__u32 l6[4] = {skops->local_ip6[0], skops->local_ip6[1], skops->local_ip6[2], skops->local_ip6[3]};
	__u32 r6[4] = {skops->remote_ip6[0], skops->remote_ip6[1], skops->remote_ip6[2], skops->remote_ip6[3]};
	struct sl_bare_key k = {
		.local_ip4 = ip4_of(skops->family, skops->local_ip4, l6),
		.remote_ip4 = ip4_of(skops->family, skops->remote_ip4, r6),
		.local_port = skops->local_port,
		.remote_port = bpf_ntohl(skops->remote_port),
	};
	if (!k.local_ip4 || !k.remote_ip4)
		return 1;
	if (loopback(k.local_ip4) && loopback(k.remote_ip4))
		k.netns = bpf_get_netns_cookie(skops);
	count(bpf_sock_hash_update(skops, &sl_bare_socks, &k, BPF_NOEXIST) ? SL_BARE_JOIN_FAILED : SL_BARE_JOINED);
	return 1;
}

SEC("sk_msg")
int sl_bare_msg(struct sk_msg_md *msg)
{
	__u32 family = msg->family;
	__u32 l6[4] = {}, r6[4] = {};
	if (family == SL_BARE_AF_INET6) {
		l6[0] = msg->local_ip6[0], l6[1] = msg->local_ip6[1], l6[2] = msg->local_ip6[2], l6[3] = msg->local_ip6[3];
		r6[0] = msg->remote_ip6[0], r6[1] = msg->remote_ip6[1], r6[2] = msg->remote_ip6[2], r6[3] = msg->remote_ip6[3];
	}
	/* The peer's key: this end's tuple reversed. */
	struct sl_bare_key peer = {
		.local_ip4 = ip4_of(family, family == SL_BARE_AF_INET ? msg->remote_ip4 : 0, r6),
		.remote_ip4 = ip4_of(family, family == SL_BARE_AF_INET ? msg->local_ip4 : 0, l6),
		.local_port = bpf_ntohl(msg->remote_port),
		.remote_port = msg->local_port,
	};
	if (!peer.local_ip4 || !peer.remote_ip4)
		return SK_PASS;
	if (loopback(peer.local_ip4) && loopback(peer.remote_ip4))
		peer.netns = bpf_get_netns_cookie(msg);
	if (bpf_msg_redirect_hash(msg, &sl_bare_socks, &peer, BPF_F_INGRESS) == SK_PASS) {
		count(SL_BARE_REDIRECTED);
		return SK_PASS;
	}
	count(SL_BARE_MISSED);
	return SK_PASS;
}

/* The stream verdict of --bare-stream-verdict: TCP's bytes for a socket
 * in the map pass into its psock's queue, as socklane's sl_skb passes
 * them (which also trims retransmitted heads: none reach a bench pod's
 * sockets, whose bytes are redirected once both ends joined). */
SEC("sk_skb/stream_verdict")
int sl_bare_skb(struct __sk_buff *skb)
{
	count(SL_BARE_SKB_PASSED);
	return SK_PASS;
}
