package peer

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"
)

// Addresses of the benchmark workloads are "IP:port" (TCP) or "unix:PATH"
// (an AF_UNIX stream socket, the reference for same-node IPC).
func splitAddr(addr string) (network, address string) {
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		return "unix", p
	}
	return "tcp", addr
}

// ListenAddr listens on a workload address (a stale unix socket file is
// replaced).
func ListenAddr(addr string) (net.Listener, error) {
	network, a := splitAddr(addr)
	if network == "unix" {
		_ = os.Remove(a)
	}
	ln, err := net.Listen(network, a)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	return ln, nil
}

// DialAddr connects to a workload address.
func DialAddr(ctx context.Context, addr string) (net.Conn, error) {
	network, a := splitAddr(addr)
	var d net.Dialer
	c, err := d.DialContext(ctx, network, a)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", addr, err)
	}
	return c, nil
}

type closeWriter interface{ CloseWrite() error }

// Sink serves stream clients: it reads each connection to EOF with a large
// buffer and answers with the byte count (8 bytes, big endian).
func Sink(ctx context.Context, ln net.Listener) error {
	return serveEach(ctx, ln, func(c net.Conn) {
		buf := make([]byte, 256<<10)
		var n uint64
		for {
			k, err := c.Read(buf)
			n += uint64(k)
			if err != nil {
				break
			}
		}
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], n)
		_, _ = c.Write(b[:])
	})
}

// Throughput of one stream run.
type Throughput struct {
	Size    int     `json:"size"`
	Bytes   uint64  `json:"bytes"`
	Seconds float64 `json:"seconds"`
	MBps    float64 `json:"mb_per_s"`   // 10^6 bytes per second, as received
	MsgRate float64 `json:"msgs_per_s"` // writes per second
}

// Stream writes size-byte messages to a sink for d (or count messages if
// count > 0), then half-closes and waits for the sink's byte count.
func Stream(ctx context.Context, addr string, size int, d time.Duration, count int) (Throughput, error) {
	c, err := DialAddr(ctx, addr)
	if err != nil {
		return Throughput{}, err
	}
	defer c.Close()
	msg := make([]byte, size)
	start := time.Now()
	deadline := start.Add(d)
	msgs := 0
	for {
		if count > 0 && msgs >= count {
			break
		}
		// The clock is read every 256 writes: cheap next to small writes.
		if count == 0 && msgs%256 == 0 && !time.Now().Before(deadline) {
			break
		}
		if _, err := c.Write(msg); err != nil {
			return Throughput{}, fmt.Errorf("writing: %w", err)
		}
		msgs++
	}
	if err := c.(closeWriter).CloseWrite(); err != nil {
		return Throughput{}, fmt.Errorf("half-closing: %w", err)
	}
	var b [8]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return Throughput{}, fmt.Errorf("reading the sink's count: %w", err)
	}
	secs := time.Since(start).Seconds()
	n := binary.BigEndian.Uint64(b[:])
	if want := uint64(msgs) * uint64(size); n != want {
		return Throughput{}, fmt.Errorf("sink received %d bytes, %d were sent", n, want)
	}
	return Throughput{Size: size, Bytes: n, Seconds: secs, MBps: float64(n) / secs / 1e6, MsgRate: float64(msgs) / secs}, nil
}

// Connects measures short connections against an echo server: connect, one
// size-byte request and its echo, close; count times.
func Connects(ctx context.Context, addr string, size, count int) (Latency, error) {
	msg := make([]byte, size)
	reply := make([]byte, size)
	rtts := make([]time.Duration, 0, count)
	for i := 0; i < count && ctx.Err() == nil; i++ {
		start := time.Now()
		c, err := DialAddr(ctx, addr)
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
