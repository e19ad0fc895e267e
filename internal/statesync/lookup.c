//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* socklane: batched reads of a synced map. The agent writes up to
 * cfg.max keys into sl_sync_io, runs this program once through
 * BPF_PROG_TEST_RUN, and reads each key's value and whether it was found
 * back from sl_sync_io: one system call for a few thousand keys where
 * BPF_MAP_LOOKUP_ELEM takes one each (the kernel has no batched lookup
 * of given keys). sl_sync_target is replaced at load time by the synced
 * map itself, its type and sizes copied from it. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "sl_sync_structs.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__uint(key_size, 8);
	__uint(value_size, 8);
} sl_sync_target SEC(".maps");

/* [keys: max * key_size][values: max * value_size][found: max bytes] */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(key_size, 4);
	__uint(value_size, SL_SYNC_IO_BYTES);
} sl_sync_io SEC(".maps");

/* Load-time settings (the target map's sizes and the io layout). */
const volatile struct sl_sync_lookup_cfg lookup_cfg = {};

static long lookup_one(__u32 i, void *unused)
{
	const volatile struct sl_sync_lookup_cfg *c = &lookup_cfg;
	__u32 ks = c->key_size, vs = c->value_size;
	__u64 koff = (__u64)i * ks, voff = c->values_off + (__u64)i * vs, foff = c->found_off + (__u64)i;
	__u32 zero = 0;
	__u8 *io, *v;

	io = bpf_map_lookup_elem(&sl_sync_io, &zero);
	if (!io)
		return 1;
	if (koff > SL_SYNC_IO_BYTES - SL_SYNC_MAX_KEY || voff > SL_SYNC_IO_BYTES - vs ||
	    foff > SL_SYNC_IO_BYTES - 1)
		return 1;
	v = bpf_map_lookup_elem(&sl_sync_target, io + koff);
	io[foff] = v != NULL;
	if (v)
		bpf_probe_read_kernel(io + voff, vs, v);
	return 0;
}

SEC("syscall")
int sl_sync_lookup(struct sl_sync_lookup_args *a)
{
	__u32 n = a->count;

	if (n > lookup_cfg.max)
		n = lookup_cfg.max;
	a->done = bpf_loop(n, lookup_one, NULL, 0);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
