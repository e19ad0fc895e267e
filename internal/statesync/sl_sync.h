/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: change capture for synced maps. Include this in a program
 * that writes a map socklane syncs, pin sl_sync_changes, sl_sync_lost
 * and sl_sync_stages in one bpffs directory, and call sl_sync_emit()
 * after every update or delete of the map:
 *
 *     bpf_map_update_elem(&flows, &key, &val, BPF_ANY);
 *     sl_sync_emit(0, &key, sizeof(key));
 *
 * then run the agent with --sync-map PIN,changes=DIR,record=0 (DIR holds
 * the pins of sl_sync_changes, sl_sync_lost and sl_sync_stages). */
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

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sl_sync_stage);
} sl_sync_stages SEC(".maps");

/* The bytes a record of a klen-byte key takes (a multiple of 8). */
#define SL_SYNC_RECORD_BYTES(klen) ((sizeof(struct sl_sync_record) + (klen) + 7) & ~7U)

static __always_inline void sl_sync_count_lost(void)
{
	__u32 zero = 0;
	__u64 *lost = bpf_map_lookup_elem(&sl_sync_lost, &zero);

	if (lost)
		__sync_fetch_and_add(lost, 1);
}

/* sl_sync_record_direct writes one record to the ring buffer. */
static __always_inline void sl_sync_record_direct(__u32 table, const void *key, __u32 klen)
{
	struct sl_sync_record *r;

	r = bpf_ringbuf_reserve(&sl_sync_changes, SL_SYNC_RECORD_BYTES(klen), 0);
	if (!r) {
		sl_sync_count_lost();
		return;
	}
	r->table = table;
	r->key_len = klen;
	__builtin_memcpy(r->key, key, klen);
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
}

/* sl_sync_emit records that key (klen bytes, a constant: sizeof, at most
 * SL_SYNC_MAX_KEY) of table was written or deleted. Never fails the
 * caller: records that do not fit are counted, and the agent reads the
 * whole map. The record goes to this CPU's stage, and the stage to the
 * ring buffer once it is nearly full; a program that interrupts another
 * one appending on the same CPU records directly. Nothing wakes the
 * reader (the agent reads the ring and the stages every millisecond
 * while records flow): a wakeup for each record that finds the reader
 * caught up costs the writer more than the record. */
static __always_inline void sl_sync_emit(__u32 table, const void *key, __u32 klen)
{
	const __u32 size = SL_SYNC_RECORD_BYTES(klen);
	struct sl_sync_record *r;
	struct sl_sync_stage *s;
	__u32 zero = 0, len;

	s = bpf_map_lookup_elem(&sl_sync_stages, &zero);
	if (!s || s->busy) {
		sl_sync_record_direct(table, key, klen);
		return;
	}
	s->busy = 1;
	asm volatile("" ::: "memory");
	len = s->len;
	if (len > SL_SYNC_STAGE_BYTES - size) {
		/* Cannot be (a stage is written out before it is this full);
		 * never trust it: what it held counts as lost, and the agent
		 * reads the whole map. */
		sl_sync_count_lost();
		len = 0;
	}
	r = (struct sl_sync_record *)&s->records[len];
	r->table = table;
	r->key_len = klen;
	__builtin_memcpy(r->key, key, klen);
	len += size;
	if (len > SL_SYNC_STAGE_BYTES - SL_SYNC_RECORD_BYTES(SL_SYNC_MAX_KEY)) {
		if (bpf_ringbuf_output(&sl_sync_changes, s->records, len, BPF_RB_NO_WAKEUP))
			sl_sync_count_lost();
		len = 0;
	}
	asm volatile("" ::: "memory");
	s->len = len;
	s->appends++;
	asm volatile("" ::: "memory");
	s->busy = 0;
}

#endif
