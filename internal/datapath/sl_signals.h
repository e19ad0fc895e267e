/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: whether the current process handles a signal that can
 * interrupt a blocking read (enum sl_signals, SL_SIG_MASK_* in
 * sl_consts.h), read from its signal handlers through BTF (CO-RE). Called
 * only where the socket's owner runs: connect(), listen(), a send. */
#ifndef SL_SIGNALS_H
#define SL_SIGNALS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

struct sigaction___sl {
	void *sa_handler;
} __attribute__((preserve_access_index));

struct k_sigaction___sl {
	struct sigaction___sl sa;
} __attribute__((preserve_access_index));

struct sighand_struct___sl {
	struct k_sigaction___sl action[SL_SIG_NSIG];
} __attribute__((preserve_access_index));

struct task_struct___sl {
	struct sighand_struct___sl *sighand;
} __attribute__((preserve_access_index));

/* SIG_DFL is 0 and SIG_IGN 1: anything above is a handler. */
#define SL_SIG_IGN 1

/* The current process's enum sl_signals: its handlers are copied in one
 * read (their layout taken from the kernel's BTF) and those of the
 * signals of SL_SIG_MASK_* looked at. What cannot be read interrupts. */
static __always_inline __u8 process_signals(void)
{
	struct task_struct___sl *task = (struct task_struct___sl *)bpf_get_current_task();
	struct sighand_struct___sl *sh = 0;
	if (!task || bpf_core_read(&sh, sizeof(sh), &task->sighand) || !sh)
		return SL_SIG_INTERRUPTS;
	__u32 zero = 0;
	struct sl_sig_scratch *s = bpf_map_lookup_elem(&sl_sig_scratch, &zero);
	if (!s)
		return SL_SIG_INTERRUPTS;
	const __u32 base = bpf_core_field_offset(struct sighand_struct___sl, action);
	const __u32 esz = bpf_core_type_size(struct k_sigaction___sl);
	const __u32 hoff = bpf_core_field_offset(struct k_sigaction___sl, sa.sa_handler);
	if (esz > SL_SIG_ENTRY_MAX || esz < sizeof(__u64) || hoff > esz - sizeof(__u64))
		return SL_SIG_INTERRUPTS;
	if (bpf_probe_read_kernel(s->b, SL_SIG_NSIG * esz, (void *)sh + base))
		return SL_SIG_INTERRUPTS;
	const __u64 mask = (__u64)SL_SIG_MASK_HI << 32 | (__u32)SL_SIG_MASK_LO;
#pragma clang loop unroll(full)
	for (int i = 0; i < SL_SIG_NSIG; i++) {
		if (!(mask & (1ULL << i)))
			continue;
		__u64 h = *(__u64 *)(s->b + i * esz + hoff);
		if (h > SL_SIG_IGN)
			return SL_SIG_INTERRUPTS;
	}
	return SL_SIG_QUIET;
}

#endif /* SL_SIGNALS_H */
