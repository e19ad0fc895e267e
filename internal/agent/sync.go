package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
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
	path := SyncSocket(name)
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/status", nil)
	if err != nil {
		return st, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return st, fmt.Errorf("asking the agent at %s: %w (is `socklane agent --sync-listen ...` running for --name %s?)", path, err, name)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("reading the sync status: %w", err)
	}
	return st, nil
}
