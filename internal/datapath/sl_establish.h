/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: sock_ops at a connection's start: the SYN a listener
 * answers (on_syn), a client's socket established (on_active), the
 * server's (on_passive), a connect() (on_connect), and the callbacks
 * each asks for (set_flags). */
#ifndef SL_ESTABLISH_H
#define SL_ESTABLISH_H

#include "sl_valve_tcp.h"

/* Adds the sock_ops callbacks in add, drops those in clear, with one
 * helper call and only where that changes them. */
static __always_inline void set_flags(struct bpf_sock_ops *skops, int add, int clear)
{
	int flags = skops->bpf_sock_ops_cb_flags;
	int want = (flags | add) & ~clear;
	if (want != flags)
		bpf_sock_ops_cb_flags_set(skops, want);
}

/* Where the valve runs, a client joining the bypass must learn at its
 * handshake's end, before its congestion control starts (on_active),
 * whether a listener of an attached cgroup on this node answered its SYN:
 * its server joins only after that, too late to tell it. The listener
 * records the tuple its client will have at the SYN it answers (the
 * request socket's BPF_SOCK_OPS_TIMEOUT_INIT) in its CPU's ring
 * (sl_syn_rings), and the client looks for it there. Between two sockets
 * of this node both run on the CPU that sent the SYN: veth and loopback
 * hand a packet to the softirq of the CPU that transmits it, so the SYN is
 * answered there, the SYN-ACK received there, and the client's socket,
 * locked by connect() meanwhile, takes it from its backlog as connect()
 * goes on, there. A client steered elsewhere (receive packet steering on a
 * pod's interface, a migration in between) or whose SYN was followed by
 * SL_SYN_RING others on that CPU misses it and keeps its congestion
 * control: slower passes through TCP, never a byte out of place. Nothing
 * is inserted or deleted: a SYN from another node's client costs its
 * listener a copy, a client that does not join costs nothing. */
static __always_inline struct sl_syn_ring *syn_ring(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&sl_syn_rings, &zero);
}

static __always_inline void on_syn(struct bpf_sock_ops *skops)
{
	if (sl_settings.backlog_valve != SL_MODE_ON || skops->is_fullsock)
		return;
	struct sl_syn_ring *r = syn_ring();
	struct sl_tuple self;
	if (!r || tuple_of(skops, &self) < 0)
		return;
	struct sl_tuple *e = &r->syn[r->next++ & (SL_SYN_RING - 1)];
	reverse(&self, e);
	e->local_seq = e->remote_seq = 0;
}

/* Whether a listener of an attached cgroup on this node answered the SYN
 * of the client with tuple t (on_syn): the newest SYNs are looked at
 * first, and the one found is taken. */
static __always_inline int server_local(const struct sl_tuple *t)
{
	struct sl_syn_ring *r = syn_ring();
	if (!r)
		return 0;
	struct sl_tuple k = *t;
	k.local_seq = k.remote_seq = 0;
	__u32 last = r->next - 1;
	for (__u32 i = 0; i < SL_SYN_RING; i++) {
		struct sl_tuple *e = &r->syn[(last - i) & (SL_SYN_RING - 1)];
		if (tuple_same(e, &k)) {
			e->local_port = e->remote_port = 0;
			return 1;
		}
	}
	return 0;
}

/* Makes st the socket of role in (slot, gen), with none of a previous
 * connection's state (a socket that connect(AF_UNSPEC) disconnected may
 * connect again). */
static __always_inline void sock_member_init(struct sl_sock *st, __u32 slot, __u32 gen, __u32 role)
{
	st->self_id = sock_id(slot, role);
	st->peer_id = sock_id(slot, role ^ 1);
	st->slot = slot;
	st->gen = gen;
	st->role = role;
	st->evict = 0;
	st->in_map = 0;
	st->evict_peer = 0;
	st->linger = 0;
	st->checked = 0;
	st->win_left = 0;
	st->over_since = 0;
	st->check_left = 0;
}

/* Joins the socket map the settings chose (valve_on). */
static __always_inline long sock_join(struct bpf_sock_ops *skops, struct sl_sock *st)
{
	if (valve_on())
		return bpf_sock_map_update(skops, &sl_sockmap, &st->self_id, BPF_NOEXIST);
	return bpf_sock_map_update(skops, &sl_sockmap_plain, &st->self_id, BPF_NOEXIST);
}

static __always_inline void on_active(struct bpf_sock_ops *skops)
{
	struct sl_tuple t;
	struct bpf_sock *sk = skops->sk;
	if (!sk || tuple_of(skops, &t) < 0)
		return;
	count(SL_C_ESTABLISHED_ACTIVE, 1);
	/* A client joins only after a real handshake: established by the
	 * SYN-ACK, not by TCP_REPAIR (which lets a process choose both
	 * sequence numbers without sending anything). */
	if ((skops->skb_tcp_flags & (SL_TCPHDR_SYN | SL_TCPHDR_ACK)) != (SL_TCPHDR_SYN | SL_TCPHDR_ACK)) {
		count(SL_C_FALLBACK_NO_HANDSHAKE, 1);
		return;
	}
	/* Bytes sent with the SYN (TCP Fast Open), acknowledged or to be sent
	 * again, went through TCP: the receiver would read redirected bytes
	 * before them. Such a connection stays on TCP. */
	if (skops->data_segs_out || skops->snd_una != skops->snd_nxt) {
		count(SL_C_FALLBACK_EARLY_DATA, 1);
		return;
	}
	__u64 netns = bpf_get_netns_cookie(skops);
	/* An opted-out client never takes a slot: its server finds none and
	 * stays out too. */
	if (bpf_map_lookup_elem(&sl_bypass_optout, &netns)) {
		count(SL_C_FALLBACK_OPTED_OUT, 1);
		return;
	}
	__u32 skip = sl_settings.bypass_brief != SL_MODE_ON ? brief_skip(&t, netns) : 0;
	if (skip) {
		count(skip, 1);
		return;
	}

	struct sl_sock *st = bpf_sk_storage_get(&sl_sk_state, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st) {
		count(SL_C_ERR_STORAGE, 1);
		return;
	}
	/* The slot is charged to the client's owner, within its quota. */
	__u64 owner = sock_owner((struct sock *)bpf_skc_to_tcp_sock(sk));
	if (!owner_charge(owner, SL_HOLD_CONNS)) {
		count(SL_C_FALLBACK_QUOTA, 1);
		return;
	}
	__u32 slot;
	if (conn_slot_take(&slot)) {
		owner_release(owner, SL_HOLD_CONNS);
		count(SL_C_ERR_CONN_TABLE_FULL, 1);
		return;
	}
	struct sl_conn *c = conn_of(slot);
	if (!c) {
		owner_release(owner, SL_HOLD_CONNS);
		return;
	}
	__u32 gen = word_gen(c->word);
	c->client = t;
	c->start_ns = bpf_ktime_get_ns();
	c->msgs[0] = c->msgs[1] = 0;
	c->bytes[0] = c->bytes[1] = 0;
	c->tcp_msgs[0] = c->tcp_msgs[1] = 0;
	c->tcp_bytes[0] = c->tcp_bytes[1] = 0;
	c->path[0] = c->path[1] = SL_PATH_UNDECIDED;
	c->reason[0] = c->reason[1] = 0;
	c->msgs_charged[0] = c->msgs_charged[1] = 0;
	c->late_asked[0] = c->late_asked[1] = 0;
	c->late_joined[0] = c->late_joined[1] = 0;
	c->signals[SL_ROLE_CLIENT] = st->signals;
	c->signals[SL_ROLE_SERVER] = SL_SIG_UNKNOWN;
	c->cookie[SL_ROLE_CLIENT] = bpf_get_socket_cookie(skops);
	c->owner = owner;
	c->cookie[SL_ROLE_SERVER] = 0;
	c->word = mkword(gen, SL_CONN_PENDING, 1u << SL_ROLE_CLIENT);
	set_member_sock(sk, slot, SL_ROLE_CLIENT);

	sock_member_init(st, slot, gen, SL_ROLE_CLIENT);
	st->path = SL_PATH_UNDECIDED;
	st->base_seq = skops->snd_nxt;
	c->server_netns = 0;
	c->client_netns = netns;
	conn_event(c, SL_EV_ESTABLISHED, 0, 0, SL_ROLE_CLIENT);

	/* A client that reads in blocking mode, and may meet the
	 * interrupted-read bug (blocking_keeps_tcp), keeps the connection on
	 * TCP before it enters the map: in the map its reads run in the
	 * sockmap's receive path until it leaves (at a transmit that finds
	 * its queue read), so a client that reads first (its server speaks
	 * first) could get EAGAIN there. Its server finds no index entry and
	 * never joins. (A quiet one is counted where its server joins.) */
	if (blocking_risky(sock_blocking(member_sock(slot, SL_ROLE_CLIENT)), st->signals)) {
		st->path = SL_PATH_TCP;
		c->path[0] = c->path[1] = SL_PATH_TCP;
		c->reason[0] = c->reason[1] = SL_C_FALLBACK_BLOCKING;
		c->word = mkword(gen, SL_CONN_TCP, 1u << SL_ROLE_CLIENT);
		count(SL_C_CONNS_TCP, 1);
		count(SL_C_FALLBACK_BLOCKING, 1);
		conn_event(c, SL_EV_TCP, SL_C_FALLBACK_BLOCKING, SL_DIR_BOTH, SL_ROLE_CLIENT);
		set_flags(skops, BPF_SOCK_OPS_STATE_CB_FLAG, 0);
		return;
	}

	/* The client must be in the map before it is findable: the server
	 * redirects to it as soon as it joins. */
	if (sock_join(skops, st)) {
		count(SL_C_ERR_SOCKHASH, 1);
		st->path = SL_PATH_TCP;
		c->path[0] = c->path[1] = SL_PATH_TCP;
		c->word = mkword(gen, SL_CONN_TCP, 1u << SL_ROLE_CLIENT);
		set_flags(skops, BPF_SOCK_OPS_STATE_CB_FLAG, 0);
		return;
	}
	st->in_map = 1;
	if ((valve_on() || late_on()) && server_local(&t))
		unpace(skops);
	struct sl_conn_ref ref = {.slot = slot, .gen = gen};
	if (bpf_map_update_elem(&sl_conn_index, &t, &ref, BPF_ANY)) {
		count(SL_C_ERR_INDEX, 1);
		c->word = mkword(gen, SL_CONN_TCP, 1u << SL_ROLE_CLIENT);
	}
	/* STATE_CB: release on close. WRITE_HDR_OPT: a sock_ops callback on the
	 * first transmit, where a client that stays on TCP leaves the map
	 * (sk_msg programs cannot delete from a sockhash). */
	set_flags(skops, BPF_SOCK_OPS_STATE_CB_FLAG | BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG, 0);
}

static __always_inline void on_passive(struct bpf_sock_ops *skops)
{
	struct sl_tuple self, client;
	struct bpf_sock *sk = skops->sk;
	if (!sk || tuple_of(skops, &self) < 0)
		return;
	count(SL_C_ESTABLISHED_PASSIVE, 1);
	reverse(&self, &client);

	struct sl_conn_ref *ref = bpf_map_lookup_elem(&sl_conn_index, &client);
	if (!ref)
		return; /* the client is not a managed socket of this node */
	__u32 slot = ref->slot, gen = ref->gen;
	struct sl_conn *c = conn_of(slot);
	if (!c)
		return;
	/* Nothing of the slot is written unless it is still the pending
	 * connection the index entry names (an entry outlives its slot for a
	 * moment when the agent's sweep reclaims it). */
	__u64 w = c->word;
	if (word_gen(w) != gen || word_state(w) != SL_CONN_PENDING)
		return;
	struct sl_sock *st = bpf_sk_storage_get(&sl_sk_state, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st) {
		count(SL_C_ERR_STORAGE, 1);
		conn_decide(c, gen, SL_CONN_TCP, 0);
		return;
	}
	sock_member_init(st, slot, gen, SL_ROLE_SERVER);
	st->path = SL_PATH_TCP;
	st->learn = 0;
	c->server_netns = bpf_get_netns_cookie(skops);
	c->cookie[SL_ROLE_SERVER] = bpf_get_socket_cookie(skops);
	set_member_sock(sk, slot, SL_ROLE_SERVER);

	/* A server whose network namespace is opted out keeps it on TCP. */
	if (bpf_map_lookup_elem(&sl_bypass_optout, &c->server_netns)) {
		if (conn_decide(c, gen, SL_CONN_TCP, 0) == SL_CONN_TCP) {
			c->reason[0] = c->reason[1] = SL_C_FALLBACK_OPTED_OUT;
			count(SL_C_CONNS_TCP, 1);
			count(SL_C_FALLBACK_OPTED_OUT, 1);
			conn_event(c, SL_EV_TCP, SL_C_FALLBACK_OPTED_OUT, SL_DIR_BOTH, SL_ROLE_SERVER);
		}
		return;
	}

	/* A client that reads in blocking mode keeps the connection on TCP;
	 * its file is known here (connect() has not returned yet). So does a
	 * server whose listener hands out blocking sockets: deciding before it
	 * joins means its first read never runs in the sockmap's receive path.
	 * A listener not known keeps it on TCP too. Either is learned from this
	 * socket at its first transmit of data after accept(): a server that
	 * listens blocking and makes what it accepts non-blocking (postgres'
	 * backends) is bypassed from its next connection on. */
	__u8 lsig = SL_SIG_UNKNOWN;
	int lb = sl_settings.bypass_blocking != SL_MODE_ON ? listener_blocks(c, &lsig) : 0;
	c->signals[SL_ROLE_SERVER] = lsig;
	int listener_tcp = 0;
	if (lb < 0 || blocking_keeps_tcp(sock_blocking(member_sock(slot, SL_ROLE_CLIENT)), c->signals[SL_ROLE_CLIENT]) ||
	    (listener_tcp = blocking_keeps_tcp(lb, lsig))) {
		__u32 why = lb < 0 ? SL_C_FALLBACK_NO_LISTENER : SL_C_FALLBACK_BLOCKING;
		if (lb < 0 || listener_tcp) {
			st->learn = 1;
			set_flags(skops, BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG, 0);
		}
		if (conn_decide(c, gen, SL_CONN_TCP, 0) == SL_CONN_TCP) {
			c->reason[0] = c->reason[1] = why;
			count(SL_C_CONNS_TCP, 1);
			count(why, 1);
			conn_event(c, SL_EV_TCP, why, SL_DIR_BOTH, SL_ROLE_SERVER);
		}
		return;
	}

	if (sock_join(skops, st)) {
		count(SL_C_ERR_SOCKHASH, 1);
		if (conn_decide(c, gen, SL_CONN_TCP, 0) == SL_CONN_TCP) {
			count(SL_C_CONNS_TCP, 1);
			conn_event(c, SL_EV_TCP, SL_C_ERR_SOCKHASH, SL_DIR_BOTH, SL_ROLE_SERVER);
		}
		return;
	}
	__u32 state = conn_decide(c, gen, SL_CONN_BYPASS, 1u << SL_ROLE_SERVER);
	if (state != SL_CONN_BYPASS) {
		/* The client already went to TCP: nobody redirected to us, so
		 * leaving the map loses nothing. */
		sock_leave(st, st->self_id);
		return;
	}
	st->in_map = 1;
	st->path = SL_PATH_BYPASS;
	c->path[SL_ROLE_SERVER] = SL_PATH_BYPASS;
	count(SL_C_CONNS_BYPASSED, 1);
	conn_event(c, SL_EV_BYPASS, 0, 0, SL_ROLE_SERVER);
	if (valve_on() || late_on())
		unpace(skops);
	set_flags(skops, BPF_SOCK_OPS_STATE_CB_FLAG | BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG, 0);
}

/* connect() runs in the client's process: a client reading in blocking
 * mode has its process's signals read now, before its server can send to
 * it (per-process mode). */
static __always_inline void on_connect(struct bpf_sock_ops *skops)
{
	if (sl_settings.bypass_blocking != SL_MODE_PROCESS)
		return;
	struct bpf_sock *sk = skops->sk;
	if (!sk || sock_blocking((struct sock *)bpf_skc_to_tcp_sock(sk)) != 1)
		return;
	struct sl_sock *st = bpf_sk_storage_get(&sl_sk_state, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (st)
		st->signals = process_signals();
}

#endif /* SL_ESTABLISH_H */
