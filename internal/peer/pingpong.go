package peer

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"time"
)

// serveEach accepts connections on ln until ctx ends and handles each in
// its own goroutine, closing it afterwards.
func serveEach(ctx context.Context, ln net.Listener, handle func(net.Conn)) error {
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accepting: %w", err)
		}
		go func() {
			defer c.Close()
			handle(c)
		}()
	}
}

// Latency summarizes round trips in microseconds.
type Latency struct {
	Size  int     `json:"size"`
	Count int     `json:"count"`
	Mean  float64 `json:"mean_us"`
	P50   float64 `json:"p50_us"`
	P99   float64 `json:"p99_us"`
	P999  float64 `json:"p999_us"`
	Max   float64 `json:"max_us"`
}

// Summarize computes a Latency from round-trip samples.
func Summarize(size int, rtts []time.Duration) Latency {
	l := Latency{Size: size, Count: len(rtts)}
	if len(rtts) == 0 {
		return l
	}
	s := slices.Clone(rtts)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	q := func(p float64) float64 { return us(s[min(len(s)-1, int(p*float64(len(s))))]) }
	l.Mean = us(sum) / float64(len(s))
	l.P50, l.P99, l.P999 = q(0.50), q(0.99), q(0.999)
	l.Max = us(s[len(s)-1])
	return l
}

// PingPong sends count messages of size bytes to an echo server over one
// connection and times each round trip (after warmup unrecorded ones).
func PingPong(ctx context.Context, addr string, mode IO, size, count, warmup int) (Latency, error) {
	c, err := dial(ctx, addr, mode)
	if err != nil {
		return Latency{}, err
	}
	defer c.Close()
	msg := make([]byte, size)
	for i := range msg {
		msg[i] = byte(i)
	}
	reply := make([]byte, size)
	rtts := make([]time.Duration, 0, count)
	for i := 0; i < warmup+count; i++ {
		if ctx.Err() != nil {
			break
		}
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			return Latency{}, fmt.Errorf("writing: %w", err)
		}
		if _, err := io.ReadFull(c, reply); err != nil {
			return Latency{}, fmt.Errorf("reading reply: %w", err)
		}
		if i >= warmup {
			rtts = append(rtts, time.Since(start))
		}
	}
	return Summarize(size, rtts), nil
}
