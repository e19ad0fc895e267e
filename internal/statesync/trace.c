//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* socklane: change capture of a synced map nobody records changes for,
 * by tracing the kernel's map updates: fexit programs on the update and
 * delete functions of the map's type (htab_map_update_elem and the like)
 * write a change record (sl_sync.h's format, straight to the ring) for
 * every successful write of the one map they are loaded for. They see
 * writes from programs and from user space alike. Attached node-wide:
 * every write of every map of that type pays the trampoline and an id
 * compare. Loaded only where the kernel can trace (fentry/fexit). */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "sl_sync.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The part of the kernel's struct bpf_map read here, relocated against
 * the running kernel's BTF. */
struct bpf_map {
	__u32 id;
} __attribute__((preserve_access_index));

/* What the tracer is loaded for. */
struct sl_trace_cfg {
	__u32 map_id;                  /* the synced map */
	__u32 key_size;                /* its key size (at most SL_SYNC_MAX_KEY) */
	__u32 table;                   /* the record number its records carry */
	__u32 pad;
};

const volatile struct sl_trace_cfg sl_trace_settings = {};

static __always_inline void trace_write(struct bpf_map *map, const void *key, int ret)
{
	const __u32 ks = sl_trace_settings.key_size;
	struct sl_sync_record *r;
	__u32 id = 0;

	if (ret != 0 || ks == 0 || ks > SL_SYNC_MAX_KEY)
		return;
	bpf_core_read(&id, sizeof(id), &map->id);
	if (id != sl_trace_settings.map_id)
		return;
	r = bpf_ringbuf_reserve(&sl_sync_changes, SL_SYNC_RECORD_BYTES(ks), 0);
	if (!r) {
		sl_sync_count_lost();
		return;
	}
	r->table = sl_trace_settings.table;
	r->key_len = ks;
	if (bpf_probe_read_kernel(r->key, ks, key)) {
		bpf_ringbuf_discard(r, 0);
		sl_sync_count_lost();
		return;
	}
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
}

/* update(map, key, value, flags) -> ret; attached to the map type's
 * update function at load. */
SEC("fexit/htab_map_update_elem")
int sl_trace_update(__u64 *ctx)
{
	trace_write((struct bpf_map *)ctx[0], (const void *)ctx[1], (int)ctx[4]);
	return 0;
}

/* delete(map, key) -> ret. */
SEC("fexit/htab_map_delete_elem")
int sl_trace_delete(__u64 *ctx)
{
	trace_write((struct bpf_map *)ctx[0], (const void *)ctx[1], (int)ctx[2]);
	return 0;
}
