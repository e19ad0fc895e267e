/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: change records of synced maps, shared with Go through BTF.
 *
 * A program that writes a synced map tells socklane which key it wrote
 * by a record in the ring buffer sl_sync_changes (sl_sync.h). The record
 * names the key only: the agent reads the key's value from the map when
 * it takes the record. Records are in the order their writers reserved
 * them, which for two writes of one key on two CPUs (or a write and a
 * peer's version the agent applied meanwhile) need not be the order of
 * the writes, and a writer may be preempted between its write and its
 * record; only the map knows the last value. A record that does not fit
 * is counted in sl_sync_lost, and the agent then reads the whole map. */
#ifndef SL_SYNC_STRUCTS_H
#define SL_SYNC_STRUCTS_H

#include <linux/types.h>

enum sl_sync_limits {
	SL_SYNC_MAX_KEY = 64,          /* bytes of key a record carries */
	SL_SYNC_RING_BYTES = 1 << 25,  /* ring buffer of change records (32 MiB: 1,398,101 records of an 8-byte key) */
	SL_CHURN_BATCH = 256,          /* most keys one churn run writes */
	SL_SYNC_IO_BYTES = 1 << 20,    /* the batched lookup's buffer (lookup.c) */
	SL_SYNC_MAX_VALUE = 4096,      /* largest value the batched lookup reads */
	SL_SYNC_STAGE_BYTES = 1024,    /* records a CPU stages before it writes them to the ring at once */
};

/* A change record: the header, then key_len bytes of key, padded to a
 * multiple of 8 bytes. A sample of the ring buffer is one or more records
 * back to back. */
struct sl_sync_record {
	__u32 table;                   /* the map's number (--sync-map ...,record=N) */
	__u32 key_len;
	__u8 key[];
};

/* A CPU's staged records (sl_sync_stages, a per-CPU array of one): a
 * writer appends its record here and writes the whole stage to the ring
 * in one sample once another record might not fit, which costs a
 * fraction of a ring buffer reservation per record. The agent also reads
 * the stages every time it reads the ring, for records still staged. */
struct sl_sync_stage {
	__u32 busy;                    /* a program of this CPU is appending (another one records directly) */
	__u32 len;                     /* bytes of records staged */
	__u64 appends;                 /* records ever staged here: the agent reads a stage again when it moved */
	__u8 records[SL_SYNC_STAGE_BYTES];
};

/* What the churn program (the writer the tests and the bench use) does. */
enum sl_churn_op {
	SL_CHURN_PUT = 0,
	SL_CHURN_DELETE = 1,
};

struct sl_churn_val {
	__u64 seq;
	__u64 written_ns;
	__u32 src[4];
	__u32 dst[4];
};

struct sl_churn_args {
	__u64 key;
	__u32 op;                      /* enum sl_churn_op */
	__u32 capture;                 /* emit change records */
	struct sl_churn_val val;
	__s32 ret;                     /* out: the first failed update's result */
	__u32 count;                   /* keys key .. key+count-1 (0: one), values seq .. seq+count-1 */
};

/* The batched lookup's settings (lookup.c): the synced map's sizes and
 * where its values and found flags start in sl_sync_io. */
struct sl_sync_lookup_cfg {
	__u32 key_size;
	__u32 value_size;
	__u32 max;                     /* keys one run reads */
	__u32 values_off;
	__u32 found_off;
};

struct sl_sync_lookup_args {
	__u32 count;                   /* keys in sl_sync_io */
	__s32 done;                    /* out: keys read (bpf_loop's result) */
};

#endif
