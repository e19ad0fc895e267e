/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: kernel types read through BTF (CO-RE), only the fields used,
 * and what the datapath reads of a socket through them. */
#ifndef SL_KERNEL_H
#define SL_KERNEL_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

struct file {
	unsigned int f_flags;
} __attribute__((preserve_access_index));

struct socket {
	struct file *file;
} __attribute__((preserve_access_index));

/* What the receive buffer may grow to: tcp_rmem[2] of the socket's
 * network namespace. */
struct netns_ipv4 {
	int sysctl_tcp_rmem[3];
} __attribute__((preserve_access_index));

struct net {
	struct netns_ipv4 ipv4;
} __attribute__((preserve_access_index));

struct sock_common {
	__u16 skc_num; /* local port, host order */
	struct {
		struct net *net;
	} skc_net;
	struct {
		__s64 counter;
	} skc_cookie;
} __attribute__((preserve_access_index));

struct kernfs_node {
	__u64 id;
} __attribute__((preserve_access_index));

struct cgroup {
	struct kernfs_node *kn;
} __attribute__((preserve_access_index));

struct sock_cgroup_data {
	struct cgroup *cgroup;
} __attribute__((preserve_access_index));

struct sk_buff_head {
	__u32 qlen;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
	struct sk_buff_head sk_receive_queue;
	void *sk_user_data;
	int sk_rcvbuf;
	__u8 sk_userlocks;
	struct socket *sk_socket;
	struct sock_cgroup_data sk_cgrp_data;
} __attribute__((preserve_access_index));

#define SL_O_NONBLOCK 04000
#define SL_SOL_TCP 6
#define SL_TCP_NOTSENT_LOWAT 25
#define SL_TCP_WINDOW_CLAMP 10
#define SL_TCP_BPF_SNDCWND_CLAMP 1002
#define SL_TCP_CONGESTION 13
#define SL_TCP_CA_NAME_MAX 16
#define SL_CLOCK_MONOTONIC 1

/* msg_tot_len: bytes redirected into a socket and not yet read.
 * apply_bytes: what is left of the socket's open verdict window.
 * refcnt: 1 for the map, plus one per send or receive running on it. */
struct refcount_struct {
	struct {
		int counter;
	} refs;
} __attribute__((preserve_access_index));

struct list_head {
	struct list_head *next;
} __attribute__((preserve_access_index));

/* msg_tot_len is recent (the sockmap FIONREAD fixes); ingress_msg, the
 * queue it counts, is not. ingress_skb: TCP's bytes an sk_skb verdict
 * passed to the socket that wait for the psock's worker to join
 * ingress_msg. */
struct sk_psock {
	__u32 apply_bytes;
	__u32 msg_tot_len;
	struct refcount_struct refcnt;
	struct list_head ingress_msg;
	struct sk_buff_head ingress_skb;
} __attribute__((preserve_access_index));

/* The kernel's sk_buff, for the TCP control block of a segment an sk_skb
 * verdict judges (TCP_SKB_CB: seq is its first word, left as TCP queued it;
 * the sockmap's own use of the block starts past it). */
struct sk_buff {
	char cb[48];
} __attribute__((preserve_access_index));

/* A kfunc of 6.3 on: the kernel's sk_buff behind a program's __sk_buff.
 * Weak, as bpf_rdonly_cast; the valve, which needs it, is refused where it
 * is absent (Features.ValveUnfit). */
extern void *bpf_cast_to_kern_ctx(void *obj) __ksym __weak;

/* Low bits of sk_user_data are flags (SK_USER_DATA_PTRMASK). */
#define SL_USER_DATA_PTRMASK (~7UL)

struct tcp_sock {
	__u32 write_seq;
	__u32 rcv_nxt;
	__u32 rcv_wup;
	__u32 rcv_wnd;
	__u32 window_clamp;
	__u32 snd_cwnd_clamp;
	__u8 nonagle;
} __attribute__((preserve_access_index));

#define SL_SOCK_RCVBUF_LOCK 2
#define SL_TCP_NAGLE_OFF 1
#define SL_TCP_NAGLE_CORK 2

/* A kfunc of 6.2 on: a pointer the verifier lets a program read through
 * directly (read-only, each load fault-tolerant), for a type it names by
 * its kernel BTF id. Weak: absent on older kernels, where its address reads
 * 0 (sl_ksym_exists) and its branch is dead code. */
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym __weak;
#define sl_ksym_exists(sym) (!!&(sym))

/* sk's TCP fields read by plain loads where the kernel can type the
 * pointer (bpf_rdonly_cast, 6.2 on), else 0: the caller then reads them
 * with bpf_probe_read_kernel, a helper call each (about 10-20 ns; the
 * valve reads four at every verdict). */
static __always_inline struct tcp_sock *tcp_ro(struct sock *sk)
{
	if (!sk || !sl_ksym_exists(bpf_rdonly_cast))
		return 0;
	return bpf_rdonly_cast(sk, bpf_core_type_id_kernel(struct tcp_sock));
}

/* A plain load through tcp_ro or psock_ro, kept apart from the probed
 * read of the other branch: clang would otherwise merge the two into one
 * load from either pointer, which the verifier refuses. */
#define sl_ro_load(v) ({ typeof(v) __v = (v); asm volatile("" : "+r"(__v)); __v; })

/* ps read by plain loads, as tcp_ro, else 0. */
static __always_inline struct sk_psock *psock_ro(struct sk_psock *ps)
{
	if (!ps || !sl_ksym_exists(bpf_rdonly_cast))
		return 0;
	return bpf_rdonly_cast(ps, bpf_core_type_id_kernel(struct sk_psock));
}

/* Whether TCP would coalesce tp's small writes into segments: Nagle on
 * (no TCP_NODELAY), or the socket corked (TCP_CORK). With TCP_NODELAY
 * alone each write leaves as a segment of its own. */
static __always_inline int tcp_coalesces(struct tcp_sock *tp)
{
	if (!tp)
		return 1;
	/* A 4-bit field. */
	__u8 nonagle = BPF_CORE_READ_BITFIELD_PROBED(tp, nonagle);
	return !(nonagle & SL_TCP_NAGLE_OFF) || (nonagle & SL_TCP_NAGLE_CORK);
}

/* The bytes sk's TCP may still raise its SO_RCVBUF by when a segment
 * arrives past it (tcp_clamp_window: up to tcp_rmem[2], unless the
 * application set SO_RCVBUF). */
static __always_inline __u32 rcvbuf_growth(struct sock *sk)
{
	/* A 4-bit field on some kernels (6.1), a byte on others. */
	struct tcp_sock *ro = tcp_ro(sk);
	__u8 locks = ro ? sl_ro_load((__u8)BPF_CORE_READ_BITFIELD((struct sock *)ro, sk_userlocks))
			: BPF_CORE_READ_BITFIELD_PROBED(sk, sk_userlocks);
	if (locks & SL_SOCK_RCVBUF_LOCK)
		return 0;
	struct net *net = sk->__sk_common.skc_net.net;
	if (!net)
		return 0;
	int max = net->ipv4.sysctl_tcp_rmem[2];
	return max > sk->sk_rcvbuf ? max - sk->sk_rcvbuf : 0;
}

/* The read mode of a socket's file: 1 blocking, 0 non-blocking, -1 not
 * known yet (an accepted socket before accept() returned it). */
static __always_inline int sock_blocking(struct sock *sk)
{
	if (!sk)
		return -1;
	struct socket *so = sk->sk_socket;
	if (!so)
		return -1;
	struct file *f = so->file;
	if (!f)
		return -1;
	return !(f->f_flags & SL_O_NONBLOCK);
}

/* The id of sk's cgroup (v2), what the socket's owner quotas are charged
 * to: set when the socket is made, so a pod cannot move its sockets to
 * another owner. 0 if unknown. */
static __always_inline __u64 sock_owner(struct sock *sk)
{
	if (!sk)
		return 0;
	struct cgroup *cg = sk->sk_cgrp_data.cgroup;
	if (!cg)
		return 0;
	struct kernfs_node *kn = cg->kn;
	if (!kn)
		return 0;
	return kn->id;
}

static __always_inline struct sk_psock *psock_of(struct sock *sk)
{
	if (!sk)
		return 0;
	return (struct sk_psock *)((unsigned long)sk->sk_user_data & SL_USER_DATA_PTRMASK);
}

/* Whether queued_bytes counts bytes (sk_psock.msg_tot_len), not only
 * whether any are queued. */
static __always_inline int psock_counts_bytes(void)
{
	return bpf_core_field_exists(((struct sk_psock *)0)->msg_tot_len);
}

/* Bytes redirected into sk and not yet read by its application. On a
 * kernel without sk_psock.msg_tot_len: 1 if any are queued, else 0 (what
 * leaving the map safely needs; the backlog rule is then off, since no
 * limit is 1 byte). */
static __always_inline __u32 queued_bytes(struct sock *sk)
{
	struct sk_psock *ps = psock_of(sk);
	__u32 queued = 0;
	if (!ps)
		return 0;
	if (bpf_core_field_exists(ps->msg_tot_len)) {
		/* Read by a plain load where the kernel can type the pointer
		 * (read-only, faults tolerated): the helper call costs about
		 * as much again as the rest of a backlog check. */
		if (sl_ksym_exists(bpf_rdonly_cast)) {
			struct sk_psock *ro = bpf_rdonly_cast(ps, bpf_core_type_id_kernel(struct sk_psock));
			return ro->msg_tot_len;
		}
		bpf_core_read(&queued, sizeof(queued), &ps->msg_tot_len);
		return queued;
	}
	struct list_head *next = 0;
	bpf_core_read(&next, sizeof(next), &ps->ingress_msg.next);
	return next && next != &ps->ingress_msg;
}

/* Whether sk, the peer of a socket about to leave the map, might still
 * redirect to it: under an open verdict window, or from a send already past
 * its verdict (the kernel releases the sender's lock around the redirect,
 * holding a reference on the sender's psock). Called only once the
 * direction from sk is on TCP, so every verdict sk runs from now on passes
 * to TCP. Any other reference (a receive in progress) also counts as busy:
 * the caller retries at its next transmit. */
static __always_inline int peer_may_redirect(struct sock *sk)
{
	struct sk_psock *ps = psock_of(sk);
	if (!ps)
		return 0;
	__u32 left = 0;
	int refs = 0;
	bpf_core_read(&left, sizeof(left), &ps->apply_bytes);
	bpf_core_read(&refs, sizeof(refs), &ps->refcnt.refs.counter);
	return left || refs > 1;
}

/* Whether segments an sk_skb verdict passed to sk wait for its psock's
 * worker (its queue could not take them at once): not in the psock's
 * queue yet, nor counted by queued_bytes; leaving the map drops them. */
static __always_inline int psock_skbs_waiting(struct sock *sk)
{
	struct sk_psock *ps = psock_of(sk);
	__u32 n = 0;
	if (ps)
		bpf_core_read(&n, sizeof(n), &ps->ingress_skb.qlen);
	return n;
}

/* Whether TCP's bytes for sk have arrived but are not in its psock's
 * queue: waiting for the psock's worker (an sk_skb verdict passed them
 * while the queue could not take them at once), or still in TCP's receive
 * queue, where they stay until the application has accepted the socket
 * (the sk_skb verdict runs from data_ready, which does nothing for a
 * socket with no file yet). A redirect now would overtake them. */
static __always_inline int tcp_bytes_waiting(struct sock *sk)
{
	__u32 q = 0;
	bpf_core_read(&q, sizeof(q), &sk->sk_receive_queue.qlen);
	return psock_skbs_waiting(sk) || q;
}

/* The next sequence number sk's TCP expects: every byte its peer sent
 * through TCP below it has arrived. */
static __always_inline __u32 tcp_rcv_nxt(struct sock *sk)
{
	__u32 seq = 0;
	bpf_core_read(&seq, sizeof(seq), &((struct tcp_sock *)sk)->rcv_nxt);
	return seq;
}

/* The bytes sk's TCP last let its peer send past what has arrived
 * (tcp_receive_window): what the peer's TCP may send at once, however
 * full sk's buffer has become since it said so. */
static __always_inline __u32 tcp_window_open(struct sock *sk)
{
	struct tcp_sock *tp = (struct tcp_sock *)sk, *ro = tcp_ro(sk);
	__u32 wup = 0, wnd = 0, nxt = 0;
	if (ro) {
		wup = sl_ro_load(ro->rcv_wup);
		wnd = sl_ro_load(ro->rcv_wnd);
		nxt = sl_ro_load(ro->rcv_nxt);
	} else {
		bpf_core_read(&wup, sizeof(wup), &tp->rcv_wup);
		bpf_core_read(&wnd, sizeof(wnd), &tp->rcv_wnd);
		bpf_core_read(&nxt, sizeof(nxt), &tp->rcv_nxt);
	}
	__s32 left = (__s32)(wup + wnd - nxt);
	return left > 0 ? left : 0;
}

/* The bytes left of sk's open verdict window (0 if none). */
static __always_inline __u32 window_left(struct sock *sk)
{
	struct sk_psock *ps = psock_of(sk);
	__u32 left = 0;
	if (ps)
		bpf_core_read(&left, sizeof(left), &ps->apply_bytes);
	return left;
}

/* Bytes copied from the head of a socket to find its cookie (in
 * sock_common, at 88 bytes on 6.18). */
#define SL_SOCK_HEAD 128

/* The sequence number of the first byte of a TCP segment an sk_skb
 * verdict judges. Returns 0 on success. */
static __always_inline int skb_tcp_seq(struct __sk_buff *ctx, __u32 *seq)
{
	if (!sl_ksym_exists(bpf_cast_to_kern_ctx))
		return -1;
	struct sk_buff *skb = bpf_cast_to_kern_ctx(ctx);
	if (!skb)
		return -1;
	*seq = *(__u32 *)skb->cb;
	return 0;
}

/* Copies size bytes at offset off (a BTF offset, constant once loaded)
 * of a socket's head to out. A bpf_sock cannot be turned into a struct
 * sock in cgroup sock programs, nor offset, so the head of the socket is
 * copied to the stack and the field read there. Returns 0 on success. */
static __always_inline int sock_head_read(const void *sk, __u32 off, __u32 size, void *out)
{
	__u8 head[SL_SOCK_HEAD];
	if (off > SL_SOCK_HEAD - size)
		return -1;
	if (bpf_probe_read_kernel(head, off + size, sk))
		return -1;
	__builtin_memcpy(out, head + off, size);
	return 0;
}

/* Whether the kernel ever gave sk a cookie. bpf_get_socket_cookie creates
 * one (a global sequence and a compare-and-swap on a socket that is
 * usually cold); this only reads. Returns 1 when it cannot tell. */
static __always_inline int sock_has_cookie(const void *sk)
{
	__s64 cookie;
	if (sock_head_read(sk, bpf_core_field_offset(struct sock, __sk_common.skc_cookie), sizeof(cookie), &cookie))
		return 1;
	return cookie != 0;
}

/* The local port of sk (a release program's bpf_sock offers none). 0 if
 * it cannot tell. */
static __always_inline __u16 sock_local_port(const void *sk)
{
	__u16 port;
	if (sock_head_read(sk, bpf_core_field_offset(struct sock, __sk_common.skc_num), sizeof(port), &port))
		return 0;
	return port;
}

#endif /* SL_KERNEL_H */
