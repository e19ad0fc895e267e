//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

/* TestLateVerdictFromTimer's programs: can a socket of a socket map
 * without a stream verdict be given one from the kernel alone, at the
 * moment a send finds it needs one? sk_msg may not update a socket map,
 * nor may sock_ops outside its ESTABLISHED and LISTEN callbacks; a tc
 * program may, and so may a bpf_timer callback that belongs to one: the
 * tc program (run once, by BPF_PROG_TEST_RUN) sets the timer's callback,
 * and the sk_msg program only starts it. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define LV_CLOCK_MONOTONIC 1

/* Key 0: the server, the redirect's target; key 1: the client. Carries
 * lv_msg only, like socklane's plain map. */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} lv_plain SEC(".maps");

/* Carries lv_skb only: a socket that joins it takes the stream verdict. */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} lv_verdict SEC(".maps");

/* The timer that joins the server to lv_verdict, and what it did. */
struct lv_timer {
	struct bpf_timer timer;
	__s64 joined; /* bpf_map_update_elem's result; LV_NO_SOCKET */
	__u32 fired;
	__u32 started;
};

enum lv_const {
	LV_NO_SOCKET = -1000, /* lv_plain held no server */
};

/* What lv_msg does with the client's next send. */
enum lv_mode {
	LV_PASS = 0,     /* through TCP */
	LV_REDIRECT = 1, /* to the server's ingress */
	LV_JOIN = 2,     /* redirected, and the timer started */
};

/* Keeps the enums in the object's BTF, for bpf2go. */
struct lv_enums {
	enum lv_const c;
	enum lv_mode m;
};
const struct lv_enums *lv_enums_unused __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lv_timer);
} lv_timers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} lv_modes SEC(".maps");

/* The callback: a subprogram of lv_timer_init, so it runs with a tc
 * program's rights, which include adding a socket to a socket map. */
static int lv_join(void *map, __u32 *key, struct lv_timer *t)
{
	__u32 server = 0;
	t->fired++;
	struct bpf_sock *sk = bpf_map_lookup_elem(&lv_plain, &server);
	if (!sk) {
		t->joined = LV_NO_SOCKET;
		return 0;
	}
	t->joined = bpf_map_update_elem(&lv_verdict, &server, sk, BPF_ANY);
	bpf_sk_release(sk);
	return 0;
}

/* Returns 0, or 100 + bpf_timer_init's error, 200 + the callback's. */
SEC("tc")
int lv_timer_init(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct lv_timer *t = bpf_map_lookup_elem(&lv_timers, &zero);
	if (!t)
		return 1;
	long err = bpf_timer_init(&t->timer, &lv_timers, LV_CLOCK_MONOTONIC);
	if (err)
		return 100 - err;
	err = bpf_timer_set_callback(&t->timer, lv_join);
	if (err)
		return 200 - err;
	return 0;
}

SEC("sk_msg")
int lv_msg(struct sk_msg_md *msg)
{
	__u32 zero = 0;
	__u32 *mode = bpf_map_lookup_elem(&lv_modes, &zero);
	if (!mode || *mode == LV_PASS)
		return SK_PASS;
	if (*mode == LV_JOIN) {
		struct lv_timer *t = bpf_map_lookup_elem(&lv_timers, &zero);
		if (t && !bpf_timer_start(&t->timer, 0, 0))
			t->started++;
	}
	return bpf_msg_redirect_map(msg, &lv_plain, 0, BPF_F_INGRESS);
}

/* Passes every segment: TCP's bytes then queue with the redirected ones. */
SEC("sk_skb/stream_verdict")
int lv_skb(struct __sk_buff *skb)
{
	return SK_PASS;
}

char _license[] SEC("license") = "GPL";
