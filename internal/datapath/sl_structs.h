/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: data structures shared by the datapath and (through BTF) Go. */
#ifndef SL_STRUCTS_H
#define SL_STRUCTS_H

#include <linux/types.h>
#include <linux/bpf.h>

/* A pointer to a kernel socket kept in a map without a reference: reads go
 * through fault-handling loads, and the owner clears it when it closes. */
#define __kptr_untrusted __attribute__((btf_type_tag("kptr_untrusted")))
struct sock;

/* A TCP connection as seen from one of its sockets. Addresses are IPv6 or
 * IPv4-mapped IPv6 (network order), ports host order. netns is the network
 * namespace cookie when the peer is a loopback address, 0 otherwise: pod
 * addresses are unique on a node, loopback addresses are not.
 *
 * local_seq and remote_seq are the first sequence numbers after the
 * handshake (each end's initial sequence number + 1), as this socket saw
 * them when its connection was established. The two sockets of one
 * connection see the same pair, reversed; a third socket cannot: the
 * kernel picks each end's initial sequence number, and a client joins only
 * after a real handshake (not TCP_REPAIR), so a tuple planted by another
 * namespace never matches the server of someone else's connection. */
struct sl_tuple {
	__u32 local_ip[4];
	__u32 remote_ip[4];
	__u64 netns;
	__u16 local_port;
	__u16 remote_port;
	__u32 local_seq;
	__u32 remote_seq;
	__u32 pad;
};

/* The last SL_SYN_RING SYNs listeners of attached cgroups answered on one
 * CPU, as the tuples their clients will have (sequence numbers 0: a
 * request socket has none to read); next counts them. A client takes its
 * own by clearing its ports. */
struct sl_syn_ring {
	__u32 next;
	__u32 pad;
	struct sl_tuple syn[SL_SYN_RING];
};

/* A destination as one network namespace's clients see it: the remote
 * address (IPv6 or IPv4-mapped, network order) and port (host order). */
struct sl_dest {
	__u32 ip[4];
	__u64 netns;
	__u32 port;
	__u32 pad;
};

/* What the datapath learned of a destination's connections. */
struct sl_dest_stat {
	__u32 brief;    /* connections in a row not worth joining (saturates at SL_BRIEF_LEARN) */
	__u32 skipped;  /* connections left on TCP since */
	__u32 remote;   /* the last of them found no managed server (else: it was brief) */
	__u32 every;    /* one connection in this many joins as a probe */
	__u32 since;    /* connections left on TCP since the last probe */
	__u32 pad;
	__u64 joined_ns; /* when the last connection joined (learning or probing) */
};

/* Where a client's connection lives in sl_conns. */
struct sl_conn_ref {
	__u32 slot;
	__u32 gen;
};

/* One connection between two managed sockets (or a candidate for one).
 * Direction 0 is client -> server, 1 is server -> client; each direction is
 * written only by its sender, under that socket's lock. */
struct sl_conn {
	struct sl_tuple client;   /* the client socket's own view */
	__u64 word;               /* gen << 32 | state << 16 | members (bit per role) */
	__u64 start_ns;           /* CLOCK_MONOTONIC at establishment */
	__u64 msgs[2];            /* redirect verdicts, per direction */
	__u64 bytes[2];           /* bytes redirected, per direction */
	__u64 tcp_msgs[2];        /* messages that went through TCP, per direction */
	__u64 tcp_bytes[2];
	__u64 server_netns;       /* the server socket's network namespace cookie */
	__u64 client_netns;       /* the client socket's network namespace cookie */
	__u64 cookie[2];          /* socket cookie per member role: what the agent's sweep
				   * looks for after the members' cgroup is detached */
	__u64 owner;              /* cgroup id charged for the slot (the client's) */
	__u8 path[2];             /* enum sl_path per direction */
	__u8 reason[2];           /* enum sl_counter of the fallback, per direction */
	__u8 signals[2];          /* enum sl_signals per member role (per-process mode) */
	__u8 late_asked[2];       /* per member role: enum sl_late_ask, its writer's ask
				   * for the valve's verdict (--reader-verdict late; late_ask) */
	__u8 late_joined[2];      /* per member role: it joined sl_sockmap_late (late_join) */
	__u8 pad;
	__u32 msgs_charged[2];    /* messages charged to owner, per direction (msgs_quota) */
};

/* A listening endpoint (network namespace cookie and port). */
struct sl_listener {
	__u64 netns;
	__u32 port;
	__u32 pad;
};

enum sl_accepted_mode {
	SL_ACCEPTED_UNKNOWN = 0,
	SL_ACCEPTED_NONBLOCKING = 1,
	SL_ACCEPTED_BLOCKING = 2,
};

/* What the datapath knows of a listener: the mode of the last socket it
 * accepted, and until one is seen the listening socket's own mode (which
 * predicts its accepted sockets'). The listener is matched at its close by
 * cookie. */
struct sl_listener_info {
	__u64 cookie;   /* the listening socket's, 0 if found some other way */
	__u64 owner;    /* cgroup id charged for the entry */
	__u32 accepted; /* enum sl_accepted_mode: of the last socket accepted */
	__u32 listened; /* enum sl_accepted_mode: the listening socket's at listen() */
	__u32 signals;  /* enum sl_signals: of the process that listened, then of the
			 * last that answered on an accepted socket */
	__u32 pad;
};

/* The listener's information first (what Go reads: a pointer field has no
 * Go type), then the listening socket, whose mode predicts better than at
 * listen() (servers such as redis set O_NONBLOCK after listen()). The
 * pointer is used only where the kernel parses a kptr in a hash map's
 * value (listener_kptr): 6.1 does not, and the field is then never
 * written. */
struct sl_listener_val {
	struct sl_listener_info info;
	struct sock __kptr_untrusted *sk;
};

/* What one owner (a cgroup id) holds of the node-wide tables and what it was
 * refused beyond its quota. */
struct sl_owner {
	__u64 conns;
	__u64 listeners;
	__u64 refused_conns;
	__u64 refused_listeners;
	__u64 evict_timers; /* sl_evict_timers entries of its connections' sockets */
	__u64 refused_evict_timers;
	__u64 msgs;         /* messages its connections' sends may hold in receivers' queues */
	__u64 refused_msgs; /* sends refused for it (SL_C_MSG_QUOTA) */
};

/* The member sockets of a connection slot, for reading the receiver's queue.
 * Kernel-only (userspace reads zeros), so it has no Go type. */
struct sl_conn_socks {
	struct sock __kptr_untrusted *client;
	struct sock __kptr_untrusted *server;
};

/* What the agent's sweep hands sl_reclaim: a slot and the state word it
 * saw, with members whose sockets are gone. */
struct sl_reclaim_args {
	__u32 slot;
	__u32 pad;
	__u64 word;
};

/* A listener found by the agent when it attaches to a cgroup (one that
 * listened before, so no listen() was seen): sl_seed_listener records it. */
struct sl_seed_args {
	__u64 netns;
	__u64 owner;
	__u32 port;
	__u32 blocking;
	__u32 signals; /* enum sl_signals of the listening process */
	__u32 pad;
};

/* Per-socket state in socket storage. */
struct sl_sock {
	__u32 self_id;   /* this socket's key in its socket map (valve_on) */
	__u32 peer_id;   /* the peer socket's key in the same map */
	__u32 slot;      /* index into sl_conns */
	__u32 gen;       /* generation of that slot when joined */
	__u32 base_seq;  /* write_seq at establishment: detects bytes sent around sk_msg */
	__u8 role;       /* enum sl_role */
	__u8 path;       /* enum sl_path for this socket's sends */
	__u8 evict;      /* leave the socket map at the next sock_ops callback */
	__u8 in_map;
	__u8 evict_peer; /* remove the peer from the socket map at the next callback */
	__u8 checked;    /* this socket's file mode was looked at */
	__u8 learn;      /* a server kept on TCP for its listener (unknown, or
			  * predicted blocking): learn the listener's mode from
			  * this socket at its first transmit of data */
	__u8 signals;    /* enum sl_signals of the process that connected (a client
			  * reading in blocking mode, per-process mode) */
	__u32 win_left;  /* bytes of the open verdict window not yet counted */
	__u32 over_since; /* when the peer's backlog went over the limit, in
			   * units of 2^20 ns (| 1); 0 while under it */
	__u32 check_left; /* bytes to send before the peer's backlog is read
			   * again: SL_BACKLOG_CHECK_BYTES, or the room under
			   * the limit it had then if more, at most
			   * SL_ROOM_CHECK_BYTES (peer_backlogged; with the
			   * valve, that room: valve_room) */
	__u32 win_at;    /* when small_stream's current unit of sends began, in
			  * units of 2^10 ns */
	__u32 rev_seen;  /* what the other direction had sent when that unit
			  * began (small_stream) */
	__u8 streak;     /* units of small sends redirected fast since the
			  * other direction last sent, up to SL_STREAM_WINDOWS
			  * (small_stream) */
	__u8 valve;      /* this socket's sends pass to TCP until its peer has
			  * caught up (valve_room) */
	__u8 lowat;      /* enum sl_lowat: the TCP_NOTSENT_LOWAT the open valve
			  * needs, set by socklane or the application's own */
	__u8 valve_mark; /* the open valve passed a send: what TCP took since
			  * valve_seq is not counted yet (valve_credit) */
	__u32 valve_seq; /* write_seq when the open valve last passed a send */
	__u32 mq_old;    /* messages redirected to the peer before mq_end, at
			  * most (msgs_held) */
	__u32 mq_new;    /* messages redirected since mq_end, at most */
	__u64 mq_end;    /* the stream offset mq_old's messages end before */
	__u32 win_bytes; /* bytes redirected since win_at: windows, and sends
			  * without one (small_stream) */
	__u8 nodelay_seen; /* this stream was counted as kept for TCP_NODELAY (small_stream) */
	__u8 valve_quota;  /* the valve opened for the owner's quota of messages (msgs_quota) */
	__u8 clamped;      /* this socket's TCP window is the valve's (valve_window) */
	__u8 valve_small;  /* the open valve's last pass was a send under SL_VALVE_SMALL_SEND */
	__u32 clamp_saved; /* the TCP_WINDOW_CLAMP the valve's replaced, restored when it ends */
	__u32 cwnd_saved;  /* the congestion window clamp valve_cwnd replaced */
	__u8 cwnd_clamped; /* this socket's congestion window is the valve's (valve_cwnd) */
	__u8 fast_small;   /* sends under the verdict window fast_send may still
			    * take: SL_WINDOW_SENDS after a full verdict that
			    * redirected without a window, else 0 */
	__u8 late;         /* in sl_sockmap_late too: given the valve's verdict
			    * when its writer first found it behind (late_join) */
	__u32 linger;      /* enum sl_linger: closed in the map (CLOSE before
			    * its close()) with bytes unread, a member of its
			    * slot until its close() or its timer takes it out
			    * (linger_start); or released (its close() ran) */
};

/* sl_late_timers' value: a timer whose callback (late_join) belongs to
 * sl_late_arm, a tc program: it may add a socket to a socket map, which
 * sl_msg may not. */
struct sl_late_timer {
	struct bpf_timer timer;
};

/* sl_skb_seqs' value: the sequence number after the last TCP segment
 * sl_skb passed to a socket. */
struct sl_skb_seq {
	__u32 next;
	__u32 pad;
};

/* A socket waiting to leave the map (sl_evict_timers, keyed by its key in
 * sl_sockmap): the generation of its slot, the checks made since it last
 * transmitted, and when the checks end. */
struct sl_evict_timer {
	struct bpf_timer timer;
	__u32 gen;
	__u32 tries;
	__u64 until_ns;
	__u64 owner;  /* charged one timer (owner_evict_timers) */
	__u32 linger; /* its socket closed in the map and keeps its slot
		       * membership until this timer takes it out
		       * (linger_start) */
	__u32 pad;
};

/* Scratch space for one process's signal handlers (sl_kernel.h). */
struct sl_sig_scratch {
	__u8 b[SL_SIG_NSIG * SL_SIG_ENTRY_MAX];
};

/* Per-CPU counter block. */
struct sl_counters {
	__u64 c[SL_C_MAX];
};

#endif
