package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/statesync"
)

// syncSocketName is the agent's status socket in its state directory
// (`socklane sync status` reads it).
const syncSocketName = "sync.sock"

// SyncSocket is where the agent of instance name serves the sync status.
func SyncSocket(name string) string { return filepath.Join(node.StateDir(name), syncSocketName) }

// syncServer serves the status of the sync on a unix socket only root
// can reach.
type syncServer struct {
	srv *http.Server
	ln  net.Listener
}

func serveSync(e *statesync.Engine, name string, log *slog.Logger) (*syncServer, error) {
	path := SyncSocket(name)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("making %s: %w", filepath.Dir(path), err)
	}
	// A socket left by an agent that was killed.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing the old %s: %w", path, err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("serving the sync status at %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("restricting %s: %w", path, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(e.Status()); err != nil {
			log.Debug("writing the sync status", "err", err)
		}
	})
	mux.HandleFunc("/events", func(w http.ResponseWriter, r *http.Request) {
		after, err := strconv.ParseUint(r.URL.Query().Get("after"), 10, 64)
		if err != nil {
			http.Error(w, "after: want a sequence number", http.StatusBadRequest)
			return
		}
		var wait time.Duration
		if v := r.URL.Query().Get("wait"); v != "" {
			if wait, err = time.ParseDuration(v); err != nil || wait < 0 || wait > time.Minute {
				http.Error(w, "wait: want a duration up to 1m", http.StatusBadRequest)
				return
			}
		}
		ctx, cancel := context.WithTimeout(r.Context(), wait)
		defer cancel()
		evs := e.Events(ctx, after, wait > 0)
		if evs == nil {
			evs = []statesync.Event{}
		}
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(evs); err != nil {
			log.Debug("writing the sync events", "err", err)
		}
	})
	s := &syncServer{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, ln: ln}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("serving the sync status", "err", err)
		}
	}()
	return s, nil
}

func (s *syncServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
}

// ReadSyncStatus asks the running agent of instance name.
func ReadSyncStatus(ctx context.Context, name string) (statesync.Status, error) {
	var st statesync.Status
	err := askSync(ctx, name, "/status", 5*time.Second, &st)
	return st, err
}

// ReadSyncEvents asks the running agent of instance name for the sync
// events after seq (0: every one it keeps); with wait, it waits up to
// 30 seconds for one.
func ReadSyncEvents(ctx context.Context, name string, seq uint64, wait bool) ([]statesync.Event, error) {
	var evs []statesync.Event
	q := url.Values{"after": {strconv.FormatUint(seq, 10)}}
	if wait {
		q.Set("wait", "30s")
	}
	err := askSync(ctx, name, "/events?"+q.Encode(), 40*time.Second, &evs)
	return evs, err
}

// askSync gets path from the agent's sync socket and decodes the JSON
// answer into out.
func askSync(ctx context.Context, name, path string, timeout time.Duration, out any) error {
	sock := SyncSocket(name)
	c := http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("asking the agent at %s: %w (is `socklane agent --sync-listen ...` running for --name %s?)", sock, err, name)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("asking the agent at %s: %s", sock, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("reading the agent's answer: %w", err)
	}
	return nil
}
