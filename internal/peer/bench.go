package peer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Addresses of the benchmark workloads are "IP:port" (TCP) or "unix:PATH"
// (an AF_UNIX stream socket, the reference for same-node IPC).
func splitAddr(addr string) (network, address string) {
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		return "unix", p
	}
	return "tcp", addr
}

// IO is how the benchmark peers drive their sockets.
type IO string

const (
	// IOBlocking: blocking system calls, one per operation, as qperf and
	// netperf do. What is timed is the kernel's path.
	IOBlocking IO = "blocking"
	// IONetpoll: Go's net package (non-blocking sockets, epoll, goroutine
	// wake-ups), as event-driven servers do. Each wait adds a failed read,
	// an epoll_wait and a scheduler pass on both ends.
	IONetpoll IO = "netpoll"
)

// ParseIO checks an --io value.
func ParseIO(s string) (IO, error) {
	switch IO(s) {
	case IOBlocking, IONetpoll:
		return IO(s), nil
	}
	return "", fmt.Errorf("--io %q: want %s or %s", s, IOBlocking, IONetpoll)
}

// benchConn is a connection of the benchmark peers.
type benchConn interface {
	io.ReadWriteCloser
	CloseWrite() error
}

// DialAddr connects to a workload address with Go's net package.
func DialAddr(ctx context.Context, addr string) (net.Conn, error) {
	network, a := splitAddr(addr)
	var d net.Dialer
	c, err := d.DialContext(ctx, network, a)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", addr, err)
	}
	return c, nil
}

// dial connects to a workload address driven the given way.
func dial(ctx context.Context, addr string, mode IO) (benchConn, error) {
	if mode == IONetpoll {
		c, err := DialAddr(ctx, addr)
		if err != nil {
			return nil, err
		}
		return c.(benchConn), nil
	}
	var s *blockingSock
	var err error
	if network, path := splitAddr(addr); network == "unix" {
		s, err = connectBlocking(unix.AF_UNIX, &unix.SockaddrUnix{Name: path}, addr)
	} else {
		var ap netip.AddrPort
		if ap, err = netip.ParseAddrPort(addr); err != nil {
			return nil, fmt.Errorf("parsing %q: %w", addr, err)
		}
		s, err = dialBlocking(ap)
	}
	if err != nil {
		return nil, err
	}
	s.retryAgain = true
	return s, nil
}

// serve accepts connections on a workload address until ctx ends. With
// netpoll each connection gets its own goroutine; blocking serves them one
// after the other on one thread, as a blocking server's accept loop does
// (the benchmark's clients connect one at a time).
func serve(ctx context.Context, addr string, mode IO, ready func(string), handle func(benchConn)) error {
	if mode == IONetpoll {
		network, a := splitAddr(addr)
		if network == "unix" {
			_ = os.Remove(a)
		}
		ln, err := net.Listen(network, a)
		if err != nil {
			return fmt.Errorf("listening on %s: %w", addr, err)
		}
		ready(ln.Addr().String())
		return serveEach(ctx, ln, func(c net.Conn) { handle(c.(benchConn)) })
	}
	ln, err := Listen(addr, false)
	if err != nil {
		return err
	}
	ready(addr)
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		fd, err := ln.Accept(false)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("accepting: %w", err)
		}
		s := &blockingSock{fd: fd, retryAgain: true}
		handle(s)
		s.Close()
	}
}

// newBufPool hands out the servers' 256 KiB read buffers: allocating one per
// connection made short connections pay for its zeroing and for the
// garbage collections it caused.
func newBufPool() *sync.Pool {
	return &sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}
}

// Sink serves stream clients: it reads each connection to EOF with a large
// buffer and answers with the byte count (8 bytes, big endian).
func Sink(ctx context.Context, addr string, mode IO, ready func(string)) error {
	return SinkWith(ctx, addr, mode, ready, SinkOptions{})
}

// SinkOptions are how a sink reads.
type SinkOptions struct {
	// Delay is how long after accepting a connection it starts reading
	// (its client's first bytes queue up meanwhile).
	Delay time.Duration
	// ByFIONREAD reads as programs that size their reads by FIONREAD do
	// (nginx, Java's available()): see readByFIONREAD.
	ByFIONREAD bool
}

// SinkWith is Sink, reading each connection as o says.
func SinkWith(ctx context.Context, addr string, mode IO, ready func(string), o SinkOptions) error {
	bufs := newBufPool()
	return serve(ctx, addr, mode, ready, func(c benchConn) {
		buf := bufs.Get().(*[]byte)
		defer bufs.Put(buf)
		time.Sleep(o.Delay)
		var n uint64
		if o.ByFIONREAD {
			var err error
			if n, err = readByFIONREAD(c, *buf); err != nil {
				fmt.Fprintf(os.Stderr, "sink: %v after %d bytes; no answer\n", err, n)
				return
			}
		} else {
			for {
				k, err := c.Read(*buf)
				n += uint64(k)
				if err != nil {
					break
				}
			}
		}
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], n)
		_, _ = c.Write(b[:])
	})
}

// fionreadPatience is how long readByFIONREAD waits for FIONREAD to count
// bytes a peek saw queued.
const fionreadPatience = 2 * time.Second

// readByFIONREAD reads c to its end of file the way programs that size
// their reads by FIONREAD do: it waits for bytes (MSG_PEEK), then reads as
// many as FIONREAD says. Such a program waits for more when FIONREAD says
// 0; this one fails if FIONREAD still says 0 after fionreadPatience with
// bytes queued.
func readByFIONREAD(c benchConn, buf []byte) (uint64, error) {
	var s sock
	switch v := c.(type) {
	case *blockingSock:
		s = v
	case *net.TCPConn:
		ps, err := newPollSock(v)
		if err != nil {
			return 0, err
		}
		s = ps
	default:
		return 0, fmt.Errorf("reading by FIONREAD: a %T has no file descriptor", c)
	}
	var n uint64
	one := make([]byte, 1)
	for {
		if _, err := s.Peek(one); err != nil {
			if errors.Is(err, errEOF) {
				return n, nil
			}
			return n, fmt.Errorf("MSG_PEEK: %w", err)
		}
		avail, err := s.Available()
		for start := time.Now(); err == nil && avail == 0; avail, err = s.Available() {
			if time.Since(start) > fionreadPatience {
				return n, fmt.Errorf("FIONREAD said 0 for %v with bytes queued", fionreadPatience)
			}
			time.Sleep(time.Millisecond)
		}
		if err != nil {
			return n, fmt.Errorf("FIONREAD: %w", err)
		}
		k, err := s.Read(buf[:min(avail, len(buf))])
		n += uint64(k)
		if err != nil {
			return n, err
		}
	}
}

// Echo serves ping-pong and short-connection clients: every byte read is
// written back.
func Echo(ctx context.Context, addr string, mode IO, ready func(string)) error {
	bufs := newBufPool()
	return serve(ctx, addr, mode, ready, func(c benchConn) { echoConn(c, bufs) })
}

// echoConn writes back what it reads from c until c ends.
func echoConn(c benchConn, bufs *sync.Pool) {
	b := bufs.Get().(*[]byte)
	defer bufs.Put(b)
	EchoLoop(c, *b)
}

// EchoLoop writes back what it reads from rw, through buf, until a read
// or a write fails: one read and one write a message, never a splice.
func EchoLoop(rw io.ReadWriter, buf []byte) {
	for {
		n, err := rw.Read(buf)
		if n > 0 {
			if _, werr := rw.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Throughput of one stream run.
type Throughput struct {
	Size    int     `json:"size"`
	Bytes   uint64  `json:"bytes"`
	Seconds float64 `json:"seconds"`
	MBps    float64 `json:"mb_per_s"`   // 10^6 bytes per second, as received
	MsgRate float64 `json:"msgs_per_s"` // writes per second
	// SndWnd is the window the sink's TCP last offered the writer
	// (TCP_INFO's tcpi_snd_wnd) once the stream's writes were done, and
	// TailSndWnd once its tail's were (StreamOpts.TailCount).
	SndWnd     uint32 `json:"snd_wnd,omitempty"`
	TailSndWnd uint32 `json:"tail_snd_wnd,omitempty"`
}

// Stream writes size-byte messages to a sink for d (or count messages if
// count > 0), then half-closes and waits for the sink's byte count.
func Stream(ctx context.Context, addr string, mode IO, size int, d time.Duration, count int) (Throughput, error) {
	return StreamPaced(ctx, addr, mode, size, d, count, StreamOpts{})
}

// StreamOpts: how a stream's writer behaves beyond its size and count.
type StreamOpts struct {
	// Interval is a pause after each write.
	Interval time.Duration
	// NoDelay sets TCP_NODELAY on (1) or off (-1) on the writer's socket;
	// 0 keeps the socket's default (on for netpoll, Go's; off for
	// blocking sockets, as C programs'). With it off TCP holds small
	// writes while data is unacknowledged (Nagle).
	NoDelay int
	// Large is the size of a write made after the first (0: none): a
	// large send opens a verdict window that may cover the writes after
	// it unseen.
	Large int
	// TailCount writes of TailSize bytes follow the stream's (after its
	// count or duration), with a pause of TailPause before them.
	TailSize, TailCount int
	TailPause           time.Duration
	// Window reports the sink's window (Throughput.SndWnd).
	Window bool
}

// StreamPaced is Stream as opts say.
func StreamPaced(ctx context.Context, addr string, mode IO, size int, d time.Duration, count int, opts StreamOpts) (Throughput, error) {
	c, err := dial(ctx, addr, mode)
	if err != nil {
		return Throughput{}, err
	}
	defer c.Close()
	if opts.NoDelay != 0 {
		if err := setNoDelay(c, opts.NoDelay > 0); err != nil {
			return Throughput{}, fmt.Errorf("setting TCP_NODELAY: %w", err)
		}
	}
	interval := opts.Interval
	msg := make([]byte, size)
	start := time.Now()
	deadline := start.Add(d)
	msgs := 0
	for count == 0 || msgs < count {
		// The clock is read every 256 writes: cheap next to small writes.
		if count == 0 && msgs%256 == 0 && !time.Now().Before(deadline) {
			break
		}
		if _, err := c.Write(msg); err != nil {
			return Throughput{}, fmt.Errorf("writing: %w", err)
		}
		msgs++
		if msgs == 1 && opts.Large > 0 {
			if _, err := c.Write(make([]byte, opts.Large)); err != nil {
				return Throughput{}, fmt.Errorf("writing the large send: %w", err)
			}
		}
		if interval > 0 {
			time.Sleep(interval)
		}
	}
	var res Throughput
	if opts.Window {
		if res.SndWnd, err = sendWindow(c); err != nil {
			return Throughput{}, err
		}
	}
	tail := make([]byte, opts.TailSize)
	if opts.TailCount > 0 {
		time.Sleep(opts.TailPause)
	}
	for range opts.TailCount {
		if _, err := c.Write(tail); err != nil {
			return Throughput{}, fmt.Errorf("writing the tail: %w", err)
		}
	}
	if opts.Window && opts.TailCount > 0 {
		if res.TailSndWnd, err = sendWindow(c); err != nil {
			return Throughput{}, err
		}
	}
	if err := c.CloseWrite(); err != nil {
		return Throughput{}, fmt.Errorf("half-closing: %w", err)
	}
	var b [8]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return Throughput{}, fmt.Errorf("reading the sink's count: %w", err)
	}
	secs := time.Since(start).Seconds()
	n := binary.BigEndian.Uint64(b[:])
	if want := uint64(msgs)*uint64(size) + uint64(max(opts.Large, 0)) + uint64(opts.TailCount)*uint64(opts.TailSize); n != want {
		return Throughput{}, fmt.Errorf("sink received %d bytes, %d were sent", n, want)
	}
	res.Size, res.Bytes, res.Seconds, res.MBps, res.MsgRate = size, n, secs, float64(n)/secs/1e6, float64(msgs)/secs
	return res, nil
}

// sendWindow is the window c's peer last offered (TCP_INFO's tcpi_snd_wnd).
func sendWindow(c benchConn) (uint32, error) {
	var info *unix.TCPInfo
	var err error
	switch s := c.(type) {
	case *net.TCPConn:
		rc, serr := s.SyscallConn()
		if serr != nil {
			return 0, serr
		}
		if cerr := rc.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); cerr != nil {
			return 0, cerr
		}
	case *blockingSock:
		info, err = unix.GetsockoptTCPInfo(s.fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	default:
		return 0, fmt.Errorf("a %T has no TCP_INFO", c)
	}
	if err != nil {
		return 0, fmt.Errorf("reading TCP_INFO: %w", err)
	}
	return info.Snd_wnd, nil
}

// Connects measures short connections against an echo server: connect, one
// size-byte request and its echo, close; count times.
func Connects(ctx context.Context, addr string, mode IO, size, count int) (Latency, error) {
	msg := make([]byte, size)
	reply := make([]byte, size)
	rtts := make([]time.Duration, 0, count)
	for i := 0; i < count && ctx.Err() == nil; i++ {
		start := time.Now()
		c, err := dial(ctx, addr, mode)
		if err != nil {
			return Latency{}, err
		}
		if _, err := c.Write(msg); err != nil {
			c.Close()
			return Latency{}, fmt.Errorf("writing: %w", err)
		}
		if _, err := io.ReadFull(c, reply); err != nil {
			c.Close()
			return Latency{}, fmt.Errorf("reading: %w", err)
		}
		c.Close()
		rtts = append(rtts, time.Since(start))
	}
	return Summarize(size, rtts), nil
}

// setNoDelay sets TCP_NODELAY on a benchmark connection's socket.
func setNoDelay(c benchConn, on bool) error {
	switch s := c.(type) {
	case *net.TCPConn:
		return s.SetNoDelay(on)
	case *blockingSock:
		v := 0
		if on {
			v = 1
		}
		return unix.SetsockoptInt(s.fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, v)
	}
	return fmt.Errorf("a %T has no TCP_NODELAY", c)
}
