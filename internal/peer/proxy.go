package peer

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
)

// Proxy relays every connection accepted on addr to target with io.Copy
// both ways, as Go's TCP proxies do: between two *net.TCPConn the copy is
// splice(2), which reads the socket's TCP receive queue only.
func Proxy(ctx context.Context, addr, target string, ready func(string)) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	defer ln.Close()
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	ready(ln.Addr().String())
	var d net.Dialer
	for {
		down, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accepting: %w", err)
		}
		go func() {
			defer down.Close()
			up, err := d.DialContext(ctx, "tcp", target)
			if err != nil {
				return
			}
			defer up.Close()
			var wg sync.WaitGroup
			relay := func(dst, src net.Conn) {
				defer wg.Done()
				_, _ = io.Copy(dst, src)
				_ = dst.(*net.TCPConn).CloseWrite()
			}
			wg.Add(2)
			go relay(up, down)
			go relay(down, up)
			wg.Wait()
		}()
	}
}
