/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: what the datapath learns about a destination's connections,
 * per client network namespace: whether they are brief (sl_brief). */
#ifndef SL_BRIEF_H
#define SL_BRIEF_H

#include "sl_conn.h"

static __always_inline void dest_of(struct sl_dest *d, const struct sl_tuple *t, __u64 netns)
{
	__builtin_memset(d, 0, sizeof(*d));
	d->ip[0] = t->remote_ip[0];
	d->ip[1] = t->remote_ip[1];
	d->ip[2] = t->remote_ip[2];
	d->ip[3] = t->remote_ip[3];
	d->port = t->remote_port;
	d->netns = netns;
}

/* Whether a new client connection to t's destination stays on TCP: the
 * destination's last SL_BRIEF_LEARN connections from this namespace were
 * brief, or found no managed server. Probes still join, so that a
 * destination that changed is seen again (see SL_BRIEF_PROBE in
 * sl_consts.h); each one doubles the interval to the next, since a probe
 * that finds the connection no longer brief forgets the destination
 * anyway. Returns the counter to charge, or 0 to join. */
static __always_inline __u32 brief_skip(const struct sl_tuple *t, __u64 netns)
{
	struct sl_dest d;
	dest_of(&d, t, netns);
	struct sl_dest_stat *s = bpf_map_lookup_elem(&sl_brief, &d);
	if (!s || s->brief < SL_BRIEF_LEARN)
		return 0;
	__u32 n = __sync_fetch_and_add(&s->since, 1) + 1;
	__u64 now = bpf_ktime_get_ns();
	if (n >= s->every || now - s->joined_ns >= SL_BRIEF_PROBE_NS) {
		s->since = 0;
		s->joined_ns = now;
		s->every = s->every >= SL_BRIEF_PROBE_MAX / 2 ? SL_BRIEF_PROBE_MAX : s->every * 2;
		return 0;
	}
	s->skipped++;
	return s->remote ? SL_C_FALLBACK_NO_PEER : SL_C_FALLBACK_BRIEF;
}

/* Learns from a client closing what joining its connection was worth.
 * Nothing, when the connection was bypassed and brief (at most one send
 * each way: a direction's first send never opens a verdict window, so msgs
 * counts sends up to there), or when no managed server ever joined (a
 * remote or unmanaged peer; not a blocking client that never let it). A
 * bypassed connection that was not brief resets what its destination
 * learned. */
static __always_inline void brief_note(const struct sl_conn *c, __u32 state)
{
	/* A blocking client kept on TCP before its server could join
	 * (on_active) says nothing of its destination. */
	if (!c->server_netns && c->reason[SL_ROLE_CLIENT] == SL_C_FALLBACK_BLOCKING)
		return;
	struct sl_dest d;
	dest_of(&d, &c->client, c->client_netns);
	__u32 remote = state != SL_CONN_BYPASS && !c->server_netns;
	int brief = state == SL_CONN_BYPASS && c->msgs[0] <= 1 && c->msgs[1] <= 1 &&
		    c->bytes[0] <= SL_BRIEF_MAX_BYTES && c->bytes[1] <= SL_BRIEF_MAX_BYTES && !c->tcp_msgs[0] &&
		    !c->tcp_msgs[1];
	struct sl_dest_stat *s = bpf_map_lookup_elem(&sl_brief, &d);
	if (!brief && !remote) {
		if (s && state == SL_CONN_BYPASS)
			bpf_map_delete_elem(&sl_brief, &d);
		return;
	}
	if (!s) {
		struct sl_dest_stat n = {
			.brief = 1, .remote = remote, .every = SL_BRIEF_PROBE, .joined_ns = bpf_ktime_get_ns()};
		bpf_map_update_elem(&sl_brief, &d, &n, BPF_NOEXIST);
		return;
	}
	s->remote = remote;
	if (s->brief < SL_BRIEF_LEARN) {
		s->joined_ns = bpf_ktime_get_ns();
		__sync_fetch_and_add(&s->brief, 1);
	}
}

#endif /* SL_BRIEF_H */
