/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: change capture for synced maps. Include this in a program
 * that writes a map socklane syncs, pin sl_sync_changes and sl_sync_lost
 * in one bpffs directory, and call sl_sync_emit() after every update or
 * delete of the map:
 *
 *     bpf_map_update_elem(&flows, &key, &val, BPF_ANY);
 *     sl_sync_emit(0, &key, sizeof(key));
 *
 * then run the agent with --sync-map PIN,changes=DIR,record=0. */
#ifndef SL_SYNC_H
#define SL_SYNC_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "sl_sync_structs.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, SL_SYNC_RING_BYTES);
} sl_sync_changes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} sl_sync_lost SEC(".maps");

/* sl_sync_emit records that key (klen bytes, a constant: sizeof) of
 * table was written or deleted. Never fails the caller: a record that
 * does not fit is counted, and the agent reads the whole map. */
static __always_inline void sl_sync_emit(__u32 table, const void *key, __u32 klen)
{
	struct sl_sync_record *r;
	__u32 zero = 0;
	__u64 *lost;

	r = bpf_ringbuf_reserve(&sl_sync_changes, sizeof(*r) + klen, 0);
	if (!r) {
		lost = bpf_map_lookup_elem(&sl_sync_lost, &zero);
		if (lost)
			__sync_fetch_and_add(lost, 1);
		return;
	}
	r->table = table;
	r->key_len = klen;
	__builtin_memcpy(r->key, key, klen);
	bpf_ringbuf_submit(r, 0);
}

#endif
