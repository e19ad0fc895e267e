/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* socklane: constants shared by every datapath program. */
#ifndef SL_CONSTS_H
#define SL_CONSTS_H

#define SL_MAX_CONNS 65536 /* connection slots (each holds two sockets) */
#define SL_MAX_SOCKS (2 * SL_MAX_CONNS)
/* --reader-verdict late: the timers that give readers the valve's
 * verdict (one per CPU, up to this many), the readers one callback run
 * takes off the queue, and the bytes a reader's queue holds when its
 * writer asks for it (a request/response reader never holds that many). */
enum sl_late {
	SL_LATE_TIMERS = 64,
	SL_LATE_BATCH = 64,
	SL_LATE_ASK_BYTES = 64 << 10,
};
/* sl_conn.late_asked, per member role (--reader-verdict late). A reader
 * is asked for once; while its join is pending, a writer past its
 * owner's quota of messages redirects without a window (the join comes
 * within microseconds, or a time slice where the writer keeps the
 * timer's CPU busy; the reader's own budget of messages still bounds
 * it, and the valve then holds the quota), where a refused one moves to
 * TCP as without the late verdict. */
enum sl_late_ask {
	SL_ASK_NONE = 0,
	SL_ASK_PENDING,  /* queued for late_join, or joined (late_joined) */
	SL_ASK_REFUSED,  /* could not be queued or joined (a reader that
			  * half-closed: the kernel adds only ESTABLISHED and
			  * LISTEN sockets to a socket map) */
};

#define AF_INET 2
#define AF_INET6 10

/* Per-CPU counters. The Go side reads the names from BTF, so a counter is
 * defined here and nowhere else. */
enum sl_counter {
	SL_C_ESTABLISHED_ACTIVE = 0, /* managed client sockets established */
	SL_C_ESTABLISHED_PASSIVE,    /* managed server sockets established */
	SL_C_CONNS_BYPASSED,         /* connections whose both ends joined the bypass */
	SL_C_CONNS_TCP,              /* local-candidate connections left on TCP */
	SL_C_REDIRECT_MSGS,          /* redirect verdicts (a verdict window covers many sends) */
	SL_C_REDIRECT_BYTES,         /* bytes moved socket to socket */
	SL_C_REDIRECT_WINDOWS,       /* verdicts that also covered the next sends (a verdict window) */
	SL_C_REDIRECT_FAST,          /* redirect verdicts that read nothing of the receiver: the room its
				      * queue had at the last read still covered them (fast_send) */
	SL_C_PASS_MSGS,              /* messages of managed sockets left to TCP */
	SL_C_PASS_BYTES,
	SL_C_FALLBACK_PEER_NOT_READY, /* client sent before its peer joined */
	SL_C_FALLBACK_EARLY_DATA,     /* bytes went through TCP before the decision */
	SL_C_FALLBACK_BACKLOG,        /* receiver's backlog over the limit */
	SL_C_FALLBACK_PEER_GONE,      /* redirect target left the map */
	SL_C_FALLBACK_BLOCKING,       /* an end reads in blocking mode (and, per process, handles a signal
				       * that can interrupt the read): connection kept on TCP */
	SL_C_EVICTIONS,               /* sockets removed from the map (remote peer) */
	SL_C_CLOSED,                  /* managed sockets closed */
	SL_C_ERR_SOCKHASH,            /* socket could not be added to the map */
	SL_C_ERR_CONN_TABLE_FULL,     /* no free connection slot */
	SL_C_ERR_INDEX,               /* connection index update failed */
	SL_C_ERR_STORAGE,             /* socket storage unavailable */
	SL_C_EVENTS_LOST,             /* events dropped: the event ring was full */
	SL_C_CAPTURED,                /* bypassed messages captured */
	SL_C_CAPTURE_LOST,            /* messages not captured: the capture ring was full */
	SL_C_CAPTURE_RATE_DROPS,      /* messages not captured: over the capture rate limit */
	SL_C_FALLBACK_BRIEF,          /* connections left on TCP: their destination's are brief */
	SL_C_FALLBACK_NO_PEER,        /* connections left on TCP: their destination's found no managed server */
	SL_C_FALLBACK_NO_HANDSHAKE,   /* clients established without a handshake (TCP_REPAIR): left on TCP */
	SL_C_FALLBACK_QUOTA,          /* connections left on TCP: their client's owner holds its quota of slots */
	SL_C_FALLBACK_NO_LISTENER,    /* connections left on TCP: their listener's read mode is not known yet */
	SL_C_LISTENER_QUOTA,          /* listeners not learned: their owner holds its quota of entries */
	SL_C_FALLBACK_BYPASS_OFF,     /* connections left on TCP: the datapath was loaded with the bypass off */
	SL_C_BLOCKING_QUIET,          /* blocking ends let into the bypass: their process handles no signal
				       * that can interrupt a read (--blocking-sockets per-process) */
	SL_C_FALLBACK_SMALL_STREAM,   /* directions moved to TCP: a fast one-way stream of small sends,
				       * which TCP coalesces (--small-streams tcp) */
	SL_C_EVICT_TIMER_QUOTA,       /* sockets waiting to leave the map left to their transmits: their
				       * connection's owner holds its quota of timers */
	SL_C_FALLBACK_OPTED_OUT,      /* connections left on TCP: an end's network namespace is opted out
				       * of the bypass (sl_bypass_optout) */
	SL_C_VALVE_OPENS,             /* a receiver's queue neared its SO_RCVBUF: its writer's sends pass
				       * to TCP (--slow-readers valve) */
	SL_C_VALVE_CLOSES,            /* the receiver caught up: its writer's sends are redirected again */
	SL_C_VALVE_BYTES,             /* bytes the open valve passed to TCP (in pass_bytes too) */
	SL_C_SMALL_STREAM_NODELAY,    /* fast one-way streams of small sends kept in the bypass: the writer
				       * set TCP_NODELAY, so TCP would send each write on its own */
	SL_C_MSG_BUDGET,              /* a receiver's queue held its budget of messages (msg_budget):
				       * the valve opened, or the direction moved to TCP (backlog) */
	SL_C_MSG_QUOTA,               /* a connection's owner held its quota of messages (owner_msgs):
				       * the valve opened, or the direction moved to TCP (backlog) */
	SL_C_SKB_OVERLAPS,            /* TCP segments passed to a socket in the map (sl_skb) whose head
				       * repeated bytes already passed (a retransmission straddling
				       * rcv_nxt): the head was cut off */
	SL_C_SKB_OVERLAP_BYTES,       /* the bytes cut off them */
	SL_C_ERR_SKB_TRIM,            /* such heads that could not be cut off (the kernel could not pull
				       * them, or longer than SL_SKB_TRIM_MAX), or a socket whose segments
				       * could not be followed (sl_skb_seqs full): delivered twice */
	SL_C_CC_UNPACED,              /* bypassed sockets whose congestion control paces (BBR) given one
				       * that does not before it started (unpace in sl_valve_tcp.h) */
	SL_C_VALVE_CLAMPS,            /* bypassed sockets' TCP windows clamped to SL_VALVE_WINDOW, at
				       * their transmits (again after autotuning raised the clamp) */
	SL_C_VALVE_UNCLAMPS,          /* such windows' clamps ended (the socket's incoming direction moved
				       * to TCP, or it left the map): given back, unless the application
				       * or autotuning had set another since */
	SL_C_VALVE_CWND_CLAMPS,       /* bypassed sockets whose open valve passed sends under
				       * SL_VALVE_SMALL_SEND given a congestion window of
				       * SL_VALVE_SMALL_CWND (valve_cwnd in sl_valve_tcp.h) */
	SL_C_LINGERS,                 /* sockets closed in the map (CLOSE before their close(): a peer's
				       * reset or FIN) with redirected bytes unread: they kept their slot
				       * until their close(), or until their timer took them out once those
				       * were read (linger_start) */
	SL_C_LATE_VERDICTS,           /* readers given the valve's verdict when their writer first
				       * found them behind (--reader-verdict late: late_join) */
	SL_C_ERR_LATE_VERDICT,        /* such readers that could not be given it (the queue of them
				       * full, or the socket gone or not in the plain map): their
				       * writer's direction moves to TCP under the backlog rule */
	SL_C_MAX,
};

/* sl_sock.linger, changed by compare-and-swap only: a peer's reset can
 * close a socket in softirq between its sock_release program and the
 * sockmap's close, and a linger that began after sl_release looked would
 * never end. */
enum sl_linger {
	SL_LINGER_NONE = 0,
	SL_LINGER_ON = 1,       /* keeps its slot (linger_start) */
	SL_LINGER_RELEASED = 2, /* its close() ran: it may not begin to linger */
};

/* The layout of the pinned maps and the meaning of what they hold, recorded
 * in sl_layout when a datapath is created. A socklane adopts pins only with
 * its own version: bump it with any change to a pinned map's type, key,
 * value or encoding (TestLayoutFingerprint fails on structural changes
 * made without a bump). */
enum sl_layout_version {
	SL_LAYOUT_VERSION = 51,
};

/* Kernel sockmap bugs detected by behaviour when the datapath was created
 * (internal/sockbugs), one bit each, recorded in sl_kernel. */
enum sl_kernel_bug {
	SL_BUG_FIONREAD_ZERO = 1 << 0,
	SL_BUG_MSG_PEEK = 1 << 1,
	SL_BUG_SPLICE_BLIND = 1 << 2,
	SL_BUG_BLOCKING_READ_EAGAIN = 1 << 3,
	SL_BUG_EPOLL_NO_WAKEUP = 1 << 4,
	SL_BUG_FIN_LOST = 1 << 5,
	SL_BUG_REDIRECT_UNCHARGED = 1 << 6,
};

/* Connection state, packed with generation and membership in one 64-bit word
 * (see sl_structs.h) so that every transition is one compare-and-swap. */
enum sl_conn_state {
	SL_CONN_FREE = 0,
	SL_CONN_PENDING = 1, /* client joined, server not yet */
	SL_CONN_BYPASS = 2,  /* both ends joined: bypass decided */
	SL_CONN_TCP = 3,     /* decided: the connection stays on TCP */
};

/* Which path one direction of a connection uses. Only ever moves
 * UNDECIDED -> BYPASS -> TCP or UNDECIDED -> TCP: a direction that left the
 * bypass never comes back, which is what keeps bytes in order (the receiver
 * drains redirected bytes before it reads TCP's queue). */
enum sl_path {
	SL_PATH_UNDECIDED = 0,
	SL_PATH_BYPASS = 1,
	SL_PATH_TCP = 2,
};

enum sl_role {
	SL_ROLE_CLIENT = 0,
	SL_ROLE_SERVER = 1,
};

/* A connection's direction in events: the sending role's, or both. */
enum sl_dir {
	SL_DIR_CLIENT_TO_SERVER = SL_ROLE_CLIENT,
	SL_DIR_SERVER_TO_CLIENT = SL_ROLE_SERVER,
	SL_DIR_BOTH = 2,
};

/* sl_conn.word, changed only by compare-and-swap: the slot's generation
 * (bits 32-63), its enum sl_conn_state (16-31) and its members (0-15: bit
 * 1 << enum sl_role for each end that joined). */
enum sl_word {
	SL_WORD_FIELD_MASK = 0xffff,
	SL_WORD_STATE_SHIFT = 16,
	SL_WORD_GEN_SHIFT = 32,
};

/* The backlog limit when net.ipv4.tcp_rmem cannot be read. */
enum sl_defaults {
	SL_DEFAULT_BACKLOG_LIMIT = 6 << 20,
	/* Amortises sl_msg over small sends while keeping backlog and
	 * fallback decisions within 4 KiB of where they fall. */
	SL_DEFAULT_VERDICT_WINDOW = 4096,
	SL_MAX_VERDICT_WINDOW = 1 << 20,
};

/* A mode setting's value. SL_MODE_AUTO appears only in a request: the
 * loader resolves it (by the sockmap bugs found on the kernel) before the
 * programs load, which then see SL_MODE_ON or SL_MODE_OFF, or for
 * bypass_blocking SL_MODE_PROCESS. */
enum sl_mode {
	SL_MODE_AUTO = 0,
	SL_MODE_ON = 1,
	SL_MODE_OFF = 2,
	SL_MODE_PROCESS = 3, /* bypass_blocking: decided per process (enum sl_signals) */
};

/* Whether a process can be hit by the interrupted-read bug of the sockmap's
 * receive path (a blocking read interrupted by a signal with a handler
 * returns EAGAIN, where TCP restarts it or returns EINTR): it can when it
 * handles a signal that arrives while a program runs normally
 * (SL_SIG_MASK_*). Read from the process's signal handlers where it runs
 * the socket's calls: connect(), listen(), a first send. */
enum sl_signals {
	SL_SIG_UNKNOWN = 0,
	SL_SIG_QUIET = 1,      /* handles none of them: its blocking reads are never interrupted */
	SL_SIG_INTERRUPTS = 2, /* handles one (or could not be read) */
};

/* The signals that can interrupt a read in a program's normal running, bit
 * (signal - 1), low and high 32 bits: SIGUSR1, SIGUSR2, SIGALRM,
 * SIGSTKFLT, SIGCHLD, SIGCONT, SIGTSTP, SIGTTIN, SIGTTOU, SIGURG, SIGXCPU,
 * SIGXFSZ, SIGVTALRM, SIGPROF, SIGWINCH, SIGIO, SIGPWR and the real-time
 * signals from 34. Not counted: an operator's requests to reload or stop
 * (SIGHUP, SIGINT, SIGQUIT, SIGTERM), faults delivered to the faulting
 * thread, which is not in a read (SIGILL, SIGTRAP, SIGABRT, SIGBUS,
 * SIGFPE, SIGSEGV, SIGSYS, and SIGPIPE, sent to a writer), SIGKILL and
 * SIGSTOP (no handler), and 32 and 33 (the C library's own, for thread
 * cancellation and set*id()). SL_SIG_NSIG handlers are read. */
enum sl_sig_mask {
	SL_SIG_MASK_LO = 0x3ffbaa00,
	SL_SIG_MASK_HI = 0xfffffffe,
	SL_SIG_NSIG = 64,
	/* The most bytes of one k_sigaction read (32 on x86-64). */
	SL_SIG_ENTRY_MAX = 32,
};

/* Connections not worth joining the bypass: brief ones (at most one send
 * each way, of at most SL_BRIEF_MAX_BYTES) and those whose server never
 * joined. SL_BRIEF_LEARN of them in a row to one destination (from one
 * network namespace) leave its next connections on TCP, but for probes that
 * still join to keep learning: one in SL_BRIEF_PROBE at first, one in twice
 * as many after each probe, up to one in SL_BRIEF_PROBE_MAX, and at the
 * latest the first connection SL_BRIEF_PROBE_NS after the last one joined.
 * A probe that is not brief forgets the destination. */
#define SL_BRIEF_MAX_BYTES 16384
#define SL_BRIEF_LEARN 4
#define SL_BRIEF_PROBE 16
#define SL_BRIEF_PROBE_MAX 1024
#define SL_BRIEF_PROBE_NS 1000000000ull
#define SL_MAX_BRIEF 65536 /* destinations remembered (LRU) */


/* Receiver backlog (see peer_backlogged): a direction moves to TCP once its
 * peer's queue has been over the limit for SL_BACKLOG_GRACE units of 2^20
 * ns (about 50 ms: a sender on the reader's CPU queues one scheduler slice
 * ahead, which then drains), or at once above SL_BACKLOG_CAP times it. */
#define SL_BACKLOG_GRACE 48
#define SL_BACKLOG_CAP 2
/* While under the limit, the queue is read again only once this many more
 * bytes were sent (a psock read on every send is most of what sl_msg adds
 * to a bare redirect); a limit of at least SO_RCVBUF is overshot by at
 * most this. */
#define SL_BACKLOG_CHECK_BYTES (64 << 10)
/* Where the queue had more room under the limit than that at the last
 * read, it is read again once that room is used up, or this many bytes
 * were sent (peer_backlogged, and valve_room with the valve closed): the
 * queue can only have shrunk since, but the limit follows the reader's
 * SO_RCVBUF, which it may lower. */
#define SL_ROOM_CHECK_BYTES (1u << 20)
/* Sends from verdict_window up to this size open a verdict window of this
 * many bytes (sl_msg's window_of): one verdict per 256 KiB, so a backlog
 * or fallback decision comes at most 256 KiB late, against a backlog limit
 * of at least SO_RCVBUF (by default tcp_rmem max). */
#define SL_LARGE_WINDOW (256u << 10)
/* A send under verdict_window opens a window of at most this many sends
 * of its size (small_window in sl_verdict.h): a 1-byte send's is 64 bytes,
 * a 16-byte send's 1 KiB, from 64 bytes the whole verdict_window. A
 * verdict over 64 sends is under 2% of their cost; a window of 4 KiB of
 * 1-byte sends held the decisions a verdict takes (the small-stream rule,
 * the budget of messages) 4,096 sends late, and counted 4,096 messages
 * against its reader's budget at the worst. */
enum sl_window {
	SL_WINDOW_SENDS = 64,
};

/* The valve (--slow-readers valve): a writer's sends pass to TCP once its
 * receiver's queue would come within SL_VALVE_MARGIN of the receiver's
 * SO_RCVBUF (the kernel charges redirected bytes to it, and drops TCP
 * segments that arrive past it), until the receiver has every byte sent
 * through TCP and its queue is under half that limit. A writer whose
 * sends pass sleeps once SL_VALVE_LOWAT of them are unsent
 * (TCP_NOTSENT_LOWAT, set where the application has not), so that each
 * pass through TCP is about one send, not a send buffer. */
#define SL_VALVE_MARGIN (64u << 10)
/* A redirected send is a message in its receiver's queue until read: a
 * struct sk_msg (712 bytes on 6.1-6.18) from kmalloc-1k, besides its bytes,
 * charged to no cgroup and counted by no socket buffer (the kernel charges
 * the receiver the bytes only). Without a bound, 1-byte sends to a reader
 * that does not read pinned a KiB of kernel memory each, up to the backlog
 * limit's worth of sends (a GiB and more per connection, where TCP counts
 * each segment's true size against the receive buffer). A direction's peer
 * holds at most the backlog limit's worth of them, at SL_MSG_COST each
 * (msg_budget in sl_verdict.h; 6,144 at the default 6 MiB): as much kernel
 * memory as TCP lets one receive buffer grow to, twice it through the
 * backlog rule's grace. */
#define SL_MSG_COST 1024u
/* What one owner's connections may hold in their receivers' queues
 * together (sl_config's owner_msgs, enum sl_quota): the budget above bounds
 * one connection, and a pod opens thousands. Each direction charges its
 * count (msgs_held) to its connection's owner in steps of SL_MSG_CHUNK, and
 * returns what its count dropped below by more than a step; the
 * connection's last member returns the rest. A send that finds the
 * owner's quota held is counted again from its reader's queue (which
 * cannot hold more messages than bytes) and goes without a window; it is
 * still redirected while its direction holds at most SL_MSG_LIGHT messages
 * (charges of idle connections, counted at their last verdict, would
 * otherwise hold up an owner's every request), else the valve opens or
 * the direction moves to TCP (msgs_quota in sl_verdict.h). */
enum sl_msg_quota {
	SL_MSG_CHUNK = 64,
	SL_MSG_LIGHT = 16,
};
/* The valve's limit is at least this (or half the backlog limit, if less)
 * as far as the reader's buffer may still be raised (valve_limit): TCP's
 * own buffer for a reader that keeps up grows to tcp_rmem[2] (6 MiB by
 * default, 32 MiB on the test machine), redirected bytes never grow it. */
#define SL_VALVE_FLOOR (8u << 20)
enum sl_lowat {
	SL_LOWAT_THEIRS = 1, /* the application's own, left alone */
	SL_LOWAT_OURS = 2,   /* set for the open valve, cleared when it closes */
};
#define SL_VALVE_LOWAT (16 << 10)
/* The window a bypassed socket's TCP offers its peer while the valve may
 * pass the peer's sends (TCP_WINDOW_CLAMP; valve_window in sl_valve_tcp.h):
 * redirected bytes send no ACK, so each time the valve opens the writer's
 * TCP sends the whole window the reader last offered, 170-270 KB under
 * autotuning, and those bytes go the slow way. */
#define SL_VALVE_WINDOW (64 << 10)
/* The open valve passes each send as TCP segments, and each segment TCP
 * delivers is a message of its own in the reader's psock queue (an skb and
 * a KiB of sk_msg): TCP's coalescing of small segments in its receive
 * queue never runs there. A window counts bytes, so 1-byte sends with
 * TCP_NODELAY fill the 64 KiB the reader offers with 64 Ki segments, about
 * 110 MB of the node's memory for one connection (27-57 MB measured in
 * TestMessageBudget), and TCP's buffer growth (tcp_clamp_window) lets
 * them in. While the open valve passes sends under SL_VALVE_SMALL_SEND
 * bytes, the writer's congestion window is clamped to SL_VALVE_SMALL_CWND
 * segments (TCP_BPF_SNDCWND_CLAMP; valve_cwnd in sl_valve_tcp.h): the sends the
 * window holds back merge into the unsent tail of TCP's write queue, so a
 * segment carries what the writer wrote in a round trip, not one send. */
#define SL_VALVE_SMALL_SEND 512
#define SL_VALVE_SMALL_CWND 2
/* sl_skb cuts a segment's repeated head off in steps of at most
 * SL_SKB_TRIM_STEP bytes (what one bpf_skb_adjust_room may take from an
 * sk_skb), SL_SKB_TRIM_CALLS of them at most: SL_SKB_TRIM_MAX bytes, four
 * times the 64 KiB segments a device makes without BIG TCP. */
#define SL_SKB_TRIM_STEP 0xfffu
#define SL_SKB_TRIM_CALLS 64
#define SL_SKB_TRIM_MAX (SL_SKB_TRIM_STEP * SL_SKB_TRIM_CALLS)
/* The SYNs a listener of an attached cgroup answered last on one CPU
 * (sl_syn_rings, sl_establish.h): a client of this node finds its own at
 * its handshake's end, microseconds later and on the same CPU. A power of
 * two. */
#define SL_SYN_RING 16
/* A socket whose incoming direction moved to TCP leaves the map once what
 * was redirected to it is read; from its first transmit that found it busy
 * a timer re-checks, every SL_EVICT_CHECK_NS for SL_EVICT_STEP checks, then
 * twice as far apart every SL_EVICT_STEP checks up to SL_EVICT_CHECK_NS <<
 * SL_EVICT_MAX_SHIFT (64 ms; a transmit of the socket, while it waits,
 * makes the checks frequent again), for SL_EVICT_FOR_NS at most (then its
 * transmits alone check). */
#define SL_EVICT_CHECK_NS 1000000ull
#define SL_EVICT_STEP 16
#define SL_EVICT_MAX_SHIFT 6
#define SL_EVICT_FOR_NS 10000000000ull

/* Streams of small sends (see small_stream in sl_verdict.h): a direction
 * whose sends are smaller than SL_STREAM_SMALL bytes moves to TCP once
 * SL_STREAM_WINDOWS units of sends (a small send's verdict window's worth
 * of bytes, small_window: 64 sends, at most verdict_window bytes,
 * redirected under windows or, when the reader's budget of messages
 * leaves none, send by send) went with nothing sent the other way (which
 * starts the count over), each at most SL_STREAM_GAP units of 2^10 ns
 * (about 8 us) a send on average (slower ones do not count):
 * there TCP coalesces the writes into segments
 * (Nagle, autocork) and wakes the reader once per segment, the bypass once
 * per send. 8 us is above the bypass's own cost of a 1-byte send across
 * CPUs (about 5 us, the receiver's lock taken per send), so a writer the
 * bypass itself slows counts; at 4 us the 1-byte stream across CPUs moved
 * in 2 of 6 runs and stayed at half TCP's speed. Request/response traffic,
 * and one-way streams slower than that (a publisher's messages, under
 * about 120,000 a second), keep the bypass and its latency. */
#define SL_STREAM_SMALL 128
#define SL_STREAM_WINDOWS 4
#define SL_STREAM_GAP 8

#define SL_TCPHDR_SYN 0x02
#define SL_TCPHDR_ACK 0x10

#define SL_NO_SLOT 0xffffffffu
#define SL_MAX_LISTENERS 65536

#define SL_MAX_LB_CONNS 131072 /* translated connected sockets */
#define SL_MAX_AFFINITY 262144       /* ClientIP affinity entries */

/* What one owner may hold of the node-wide tables by default (struct
 * sl_config's owner_* settings), and at most: the tables' sizes. */
enum sl_quota {
	SL_OWNER_CONNS = 8192,      /* connection slots */
	SL_OWNER_LISTENERS = 1024,  /* listener entries */
	SL_OWNER_LB_CONNS = 16384,  /* translated connected sockets */
	SL_OWNER_AFFINITY = 4096,   /* ClientIP affinity entries */
	SL_OWNER_UDP_TABLES = 16384, /* UDP sockets' exchange tables (a socket's overflow table counts two) */
	SL_OWNER_EVICT_TIMERS = 256, /* timers of sockets waiting to leave the map (sl_evict_timers) */
	SL_OWNER_MSGS = 65536,      /* messages in receivers' queues (SL_MSG_COST each: 64 MiB) */
	SL_QUOTA_MAX_CONNS = SL_MAX_CONNS,
	SL_QUOTA_MAX_LISTENERS = SL_MAX_LISTENERS,
	SL_QUOTA_MAX_LB_CONNS = SL_MAX_LB_CONNS,
	SL_QUOTA_MAX_AFFINITY = SL_MAX_AFFINITY,
	SL_QUOTA_MAX_UDP_TABLES = 1048576,
	SL_QUOTA_MAX_EVICT_TIMERS = SL_MAX_SOCKS,
	SL_QUOTA_MAX_MSGS = 16777216,
};
#define SL_MAX_OWNERS 16384

/* Service load balancer sizes. */
#define SL_MAX_FRONTENDS 131072      /* (VIP, port, protocol) entries */
#define SL_MAX_BACKEND_SLOTS 1048576 /* backends over all frontends and both banks */
/* A backend slot key: the bank (0 or 1) above SL_BANK_SHIFT, the index
 * within the bank below. */
enum sl_lb_layout {
	SL_BANK_SHIFT = 16,
	/* Entries of a Maglev table (a prime): a client namespace's hash
	 * modulo this picks its entry, which names a backend slot. */
	SL_MAGLEV_SIZE = 4093,
	/* Maglev tables: frontends that use Maglev, twice (both banks). */
	SL_MAX_MAGLEV = 4096,
};

#endif
