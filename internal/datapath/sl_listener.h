/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: what a listener predicts of the sockets it hands out (sl_listeners:
 * blocking or not, its process's signals), and the rule that keeps a blocking
 * reader on TCP. */
#ifndef SL_LISTENER_H
#define SL_LISTENER_H

#include "sl_conn.h"
#include "sl_signals.h"

static __always_inline void listener_of(struct sl_conn *c, struct sl_listener *l)
{
	__builtin_memset(l, 0, sizeof(*l));
	l->netns = c->server_netns;
	l->port = c->client.remote_port;
}

/* Remembers how a listener hands out sockets, from one it handed out
 * (server): a listener not recorded at listen() (listening before socklane
 * was attached, or refused over its owner's quota then) is recorded now,
 * charged to the server's owner. */
static __always_inline void learn_listener(struct sl_listener *l, int blocking, struct sock *server, __u8 sig)
{
	__u32 mode = blocking ? SL_ACCEPTED_BLOCKING : SL_ACCEPTED_NONBLOCKING;
	struct sl_listener_val *v = bpf_map_lookup_elem(&sl_listeners, l);
	if (v) {
		if (v->info.accepted != mode)
			v->info.accepted = mode;
		if (sig && v->info.signals != sig)
			v->info.signals = sig;
		return;
	}
	__u64 owner = sock_owner(server);
	if (!owner_charge(owner, SL_HOLD_LISTENERS)) {
		count(SL_C_LISTENER_QUOTA, 1);
		return;
	}
	struct sl_listener_val nv = {.info = {.owner = owner, .accepted = mode, .signals = sig}};
	if (bpf_map_update_elem(&sl_listeners, l, &nv, BPF_NOEXIST))
		owner_release(owner, SL_HOLD_LISTENERS);
}

static __always_inline void note_listener(struct sl_conn *c, __u32 slot, int blocking, __u8 sig)
{
	struct sl_listener l;
	listener_of(c, &l);
	learn_listener(&l, blocking, member_sock(slot, SL_ROLE_SERVER), sig);
}

/* What the server's listener predicts for a socket not yet accepted: 1
 * blocking, 0 non-blocking, -1 not known (the listener was not recorded:
 * the connection is kept on TCP, the safe side, and the listener learned
 * from the socket it hands out). *sig is the enum sl_signals it knows of
 * its server's process. */
static __always_inline int listener_blocks(struct sl_conn *c, __u8 *sig)
{
	struct sl_listener l;
	listener_of(c, &l);
	struct sl_listener_val *v = bpf_map_lookup_elem(&sl_listeners, &l);
	if (!v)
		return -1;
	*sig = v->info.signals;
	if (v->info.accepted != SL_ACCEPTED_UNKNOWN)
		return v->info.accepted == SL_ACCEPTED_BLOCKING;
	if (sl_settings.listener_kptr && v->sk)
		return sock_blocking(v->sk) == 1;
	if (v->info.listened == SL_ACCEPTED_UNKNOWN)
		return -1;
	return v->info.listened == SL_ACCEPTED_BLOCKING;
}

/* Whether the server end of c reads in blocking mode. Before accept()
 * returned it, the last socket its listener handed out says, or else the
 * listening socket's own mode (event-driven servers listen non-blocking,
 * blocking servers block in accept). A listener that predates socklane is
 * assumed non-blocking. A socket accepted blocking from a listener whose
 * sockets were non-blocking when they first sent is one its process has
 * not set up yet (postgres' postmaster accepts, its backend makes the
 * socket non-blocking): the listener predicts it, and is not taught the
 * passing mode; the server's first send checks the mode it reads with. */
static __always_inline int server_blocks(struct sl_conn *c, __u32 slot, __u8 *sig)
{
	int b = sock_blocking(member_sock(slot, SL_ROLE_SERVER));
	if (b == 1) {
		struct sl_listener l;
		listener_of(c, &l);
		struct sl_listener_val *v = bpf_map_lookup_elem(&sl_listeners, &l);
		if (v && v->info.accepted == SL_ACCEPTED_NONBLOCKING) {
			*sig = v->info.signals;
			return 0;
		}
	}
	if (b >= 0) {
		note_listener(c, slot, b, SL_SIG_UNKNOWN);
		*sig = c->signals[SL_ROLE_SERVER];
		if (!*sig)
			listener_blocks(c, sig);
		return b;
	}
	return listener_blocks(c, sig) != 0;
}

/* A blocking end let into the bypass per process: its process handles no
 * signal that can interrupt a read. */
static __always_inline int blocking_quiet(int blocking, __u8 sig)
{
	return blocking == 1 && sl_settings.bypass_blocking == SL_MODE_PROCESS && sig == SL_SIG_QUIET;
}

/* blocking_keeps_tcp without counting a quiet end (for a check made again
 * where the end is counted). */
static __always_inline int blocking_risky(int blocking, __u8 sig)
{
	return blocking == 1 && sl_settings.bypass_blocking != SL_MODE_ON && !blocking_quiet(blocking, sig);
}

/* Whether an end that reads in blocking mode (blocking 1), of a process
 * with the enum sl_signals sig, keeps its connection on TCP: always under
 * --blocking-sockets tcp, never under bypass, and per process unless its
 * process handles no signal that can interrupt a read. */
static __always_inline int blocking_keeps_tcp(int blocking, __u8 sig)
{
	if (blocking != 1 || sl_settings.bypass_blocking == SL_MODE_ON)
		return 0;
	if (blocking_quiet(blocking, sig)) {
		count(SL_C_BLOCKING_QUIET, 1);
		return 0;
	}
	return 1;
}

static __always_inline void listener_key(struct bpf_sock_ops *skops, struct sl_listener *l)
{
	__builtin_memset(l, 0, sizeof(*l));
	l->netns = bpf_get_netns_cookie(skops);
	l->port = skops->local_port;
}

#endif /* SL_LISTENER_H */
