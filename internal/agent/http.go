package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/metrics"
	"github.com/socklane/socklane/internal/service"
)

// DefaultMetricsAddress is where the agent serves /metrics, /healthz and
// /readyz unless told otherwise: loopback only.
const DefaultMetricsAddress = "127.0.0.1:9464"

// httpServer serves the agent's metrics and health endpoints.
type httpServer struct {
	ln    net.Listener
	srv   *http.Server
	ready atomic.Bool
}

// listenHTTP binds addr before the agent touches the node, so a taken
// port fails the start with nothing changed.
func listenHTTP(addr string) (*httpServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-address %s: %w (choose a free address, or \"\" to serve no metrics)", addr, err)
	}
	return &httpServer{ln: ln}, nil
}

// serve starts serving dp's metrics; it returns at once.
func (h *httpServer) serve(dp *datapath.Datapath, name string, log *slog.Logger) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		metrics.New(dp, func() (map[string]string, error) { return FrontendNames(name) }, func() ([]service.Skipped, error) { return SkippedServices(name) }),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError)}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if _, err := dp.Counters(); err != nil {
			http.Error(w, "datapath unreadable: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !h.ready.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	h.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := h.srv.Serve(h.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("serving metrics", "err", err)
		}
	}()
	log.Info("serving metrics", "address", h.ln.Addr().String())
}

func (h *httpServer) close() {
	if h.srv == nil {
		h.ln.Close()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = h.srv.Shutdown(ctx)
}

// FrontendNames maps the applied services' frontends to their names.
func FrontendNames(name string) (map[string]string, error) {
	svcs, err := AppliedServices(name)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, s := range svcs {
		for _, f := range s.Frontends() {
			out[f.String()] = s.Key()
		}
	}
	return out, nil
}
