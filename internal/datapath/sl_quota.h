// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* socklane: what the owner quotas of both programs (bypass.c's
 * connections and messages, servicelb.c's tables) share. */
#ifndef SL_QUOTA_H
#define SL_QUOTA_H

#include <linux/bpf.h>

/* Returns n of what an owner holds (its count at held), never below zero:
 * an owner entry the agent removed (its cgroup gone) and a program made
 * again holds 0, and a charge returned to it must not wrap. A few tries
 * at most against racing charges and returns; a count left high errs on
 * the side of refusing, never of admitting beyond the quota. */
static __always_inline void quota_return(__u64 *held, __u64 n)
{
	for (int i = 0; i < 4; i++) {
		__u64 v = *held;
		if (!v || __sync_val_compare_and_swap(held, v, v > n ? v - n : 0) == v)
			return;
	}
}

#endif
