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

struct churn_loop {
	struct sl_churn_val val;
	__u64 key0, seq0;
	__u32 del, capture;
	int first;
};

static long churn_one(__u32 i, void *data)
{
	struct churn_loop *l = data;
	__u64 key = l->key0 + i;
	int ret;

	if (l->del) {
		ret = bpf_map_delete_elem(&sl_churn, &key);
	} else {
		l->val.seq = l->seq0 + i;
		l->val.written_ns = bpf_ktime_get_ns();
		ret = bpf_map_update_elem(&sl_churn, &key, &l->val, BPF_ANY);
	}
	if (ret && !l->first)
		l->first = ret;
	if (l->capture)
		sl_sync_emit(0, &key, sizeof(key));
	return 0;
}

SEC("syscall")
int sl_churn_write(struct sl_churn_args *a)
{
	/* Everything read from the context first: the verifier refuses
	 * accesses through a context pointer the compiler moved. */
	struct churn_loop l = {
		.val = a->val,
		.key0 = a->key,
		.del = a->op == SL_CHURN_DELETE,
		.capture = a->capture,
	};
	__u32 n = a->count;

	l.seq0 = l.val.seq;
	if (n == 0)
		n = 1;
	if (n > SL_CHURN_BATCH)
		n = SL_CHURN_BATCH;
	bpf_loop(n, churn_one, &l, 0);
	a->ret = l.first;
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
