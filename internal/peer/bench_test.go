package peer

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/testutil"
)

// TestBenchPeers runs the benchmark's servers and clients against each
// other over TCP and AF_UNIX, with both kinds of socket I/O: every round
// trip, connection and byte arrives.
func TestBenchPeers(t *testing.T) {
	for _, mode := range []IO{IOBlocking, IONetpoll} {
		for _, network := range []string{"tcp", "unix"} {
			t.Run(string(mode)+"/"+network, func(t *testing.T) {
				addrOf := func(name string) string {
					if network == "unix" {
						return "unix:" + filepath.Join(t.TempDir(), name+".sock")
					}
					return testutil.FreeAddr(t)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				start := func(serve func(context.Context, string, IO, func(string)) error, addr string) {
					ready := make(chan struct{})
					done := make(chan error, 1)
					sctx, stop := context.WithCancel(ctx)
					go func() { done <- serve(sctx, addr, mode, func(string) { close(ready) }) }()
					select {
					case <-ready:
					case err := <-done:
						t.Fatalf("server on %s: %v", addr, err)
					}
					t.Cleanup(func() {
						stop()
						if err := <-done; err != nil {
							t.Errorf("server on %s: %v", addr, err)
						}
					})
				}
				echo, sink := addrOf("echo"), addrOf("sink")
				start(Echo, echo)
				start(Sink, sink)

				l, err := PingPong(ctx, echo, mode, 3000, 50, 5)
				if err != nil || l.Count != 50 || l.Mean <= 0 {
					t.Fatalf("ping-pong: %+v, %v", l, err)
				}
				c, err := Connects(ctx, echo, mode, 64, 30)
				if err != nil || c.Count != 30 {
					t.Fatalf("connects: %+v, %v", c, err)
				}
				// Stream checks the sink's count against what it sent.
				tp, err := Stream(ctx, sink, mode, 1000, 0, 500)
				if err != nil || tp.Bytes != 500*1000 {
					t.Fatalf("stream: %+v, %v", tp, err)
				}
			})
		}
	}
}

func TestParseIO(t *testing.T) {
	for _, tc := range []struct {
		in      string
		wantErr bool
	}{{"blocking", false}, {"netpoll", false}, {"epoll", true}, {"", true}} {
		got, err := ParseIO(tc.in)
		if (err != nil) != tc.wantErr || (err == nil && string(got) != tc.in) {
			t.Errorf("ParseIO(%q) = %q, %v", tc.in, got, err)
		}
	}
}
