package peer

import (
	"context"
	"strings"
	"testing"
)

// TestHTTPGets runs the Go net/http pair on loopback: every GET brings
// its size, over one connection, and a bad path gets a 400.
func TestHTTPGets(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrs := make(chan string, 1)
	errc := make(chan error, 1)
	go func() { errc <- HTTPServe(ctx, "127.0.0.1:0", func(a string) { addrs <- a }) }()
	var base string
	select {
	case a := <-addrs:
		base = "http://" + a
	case err := <-errc:
		t.Fatal(err)
	}
	for _, size := range []int{0, 1, 4096, 1 << 20} {
		l, err := HTTPGets(ctx, base, size, 20, 2)
		if err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if l.Count != 20 || l.Size != size || l.Mean <= 0 {
			t.Errorf("size %d: %+v", size, l)
		}
	}
	if _, err := HTTPGets(ctx, base, maxHTTPBody+1, 1, 1); err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("a body over the limit: %v, want a 400", err)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("server: %v", err)
	}
}
