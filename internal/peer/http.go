package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"time"
)

// maxHTTPBody bounds what one request to the HTTP server may ask for.
const maxHTTPBody = 64 << 20

// HTTPServe serves GET /N with a body of N bytes through Go's net/http
// (its own listener, netpoller and keep-alive) until ctx ends.
func HTTPServe(ctx context.Context, addr string, ready func(string)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	body := make([]byte, maxHTTPBody)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
			if err != nil || n < 0 || n > maxHTTPBody {
				http.Error(w, "want GET /N, N bytes up to 64 MiB", http.StatusBadRequest)
				return
			}
			w.Header().Set("Content-Length", strconv.Itoa(n))
			_, _ = w.Write(body[:n])
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	ready(ln.Addr().String())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving HTTP: %w", err)
	}
	return nil
}

// HTTPGets fetches base/size count times after warmup unrecorded
// fetches, as a Go client does: one http.Client whose connection is kept
// alive, every body read to its end. It fails if a measured request did
// not reuse the connection (it would time a connect, not a round trip).
func HTTPGets(ctx context.Context, base string, size, count, warmup int) (Latency, error) {
	tr := &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 1}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	url := fmt.Sprintf("%s/%d", strings.TrimSuffix(base, "/"), size)
	reused := true
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused }}
	ctx = httptrace.WithClientTrace(ctx, trace)
	rtts := make([]time.Duration, 0, count)
	for i := range warmup + count {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return Latency{}, err
		}
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return Latency{}, fmt.Errorf("GET %s: %w", url, err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			return Latency{}, fmt.Errorf("reading GET %s: %w", url, err)
		}
		if resp.StatusCode != http.StatusOK || n != int64(size) {
			return Latency{}, fmt.Errorf("GET %s: %s, %d bytes, want %d", url, resp.Status, n, size)
		}
		if i < warmup {
			continue
		}
		rtts = append(rtts, time.Since(start))
		if !reused && i > 0 {
			return Latency{}, fmt.Errorf("GET %s: request %d opened a new connection: the server did not keep the last one alive", url, i)
		}
	}
	return Summarize(size, rtts), nil
}
