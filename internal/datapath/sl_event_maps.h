/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: maps of the event stream and the capture, pinned by name so
 * that the bypass and the service load balancer share them. */
#ifndef SL_EVENT_MAPS_H
#define SL_EVENT_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "sl_event_structs.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} sl_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sl_events_cfg);
} sl_ev_settings SEC(".maps");

/* Reserves an event if a reader is listening; NULL otherwise or when the
 * ring is full (*lost is set then). */
static __always_inline struct sl_event *event_reserve(int *lost)
{
	__u32 zero = 0;
	*lost = 0;
	struct sl_events_cfg *cfg = bpf_map_lookup_elem(&sl_ev_settings, &zero);
	if (!cfg || !cfg->until_ns)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (now >= cfg->until_ns)
		return 0;
	struct sl_event *e = bpf_ringbuf_reserve(&sl_events, sizeof(*e), 0);
	if (!e) {
		*lost = 1;
		return 0;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->ts_ns = now;
	return e;
}

#endif
