//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* socklane: a writer of a synced map, the way an eBPF load balancer
 * writes its connection-tracking table, for the sync's tests and bench.
 * Run through BPF_PROG_TEST_RUN: each run puts or deletes one key of
 * sl_churn and, when asked, records the change (sl_sync.h). */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "sl_sync.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 21);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u64);
	__type(value, struct sl_churn_val);
} sl_churn SEC(".maps");

/* Keeps the enums in BTF so that the Go side gets their names generated. */
struct sl_sync_enums {
	enum sl_sync_limits limits;
	enum sl_churn_op op;
	struct sl_sync_record record;
};
const struct sl_sync_enums *sl_sync_enums_unused __attribute__((unused));

SEC("syscall")
int sl_churn_write(struct sl_churn_args *a)
{
	__u64 key = a->key;
	struct sl_churn_val val = a->val;

	if (a->op == SL_CHURN_DELETE) {
		a->ret = bpf_map_delete_elem(&sl_churn, &key);
	} else {
		val.written_ns = bpf_ktime_get_ns();
		a->ret = bpf_map_update_elem(&sl_churn, &key, &val, BPF_ANY);
	}
	if (a->capture)
		sl_sync_emit(0, &key, sizeof(key));
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
