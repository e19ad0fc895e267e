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
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/metrics"
	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/service"
	"github.com/socklane/socklane/internal/statesync"
)

// DefaultMetricsAddress is where the agent serves /metrics, /healthz and
// /readyz unless told otherwise: loopback only.
const DefaultMetricsAddress = "127.0.0.1:9464"

// WebConfig is how the metrics endpoint is exposed.
type WebConfig struct {
	// MetricsAddress serves /metrics, /healthz and /readyz ("": none).
	MetricsAddress string
	// WebConfigFile is a Prometheus exporter web configuration (TLS
	// server certificate, client certificates, basic auth users) for
	// MetricsAddress; read again at each connection.
	WebConfigFile string
	// MetricsInsecure allows a non-loopback MetricsAddress without
	// WebConfigFile.
	MetricsInsecure bool
	// HealthAddress serves /healthz and /readyz only ("": none).
	HealthAddress string
}

// httpServer serves the agent's metrics and health endpoints.
type httpServer struct {
	cfg          WebConfig
	ln, healthLn net.Listener
	srv, health  *http.Server
	ready        atomic.Bool
	// sync, if set, is the state sync's status (its metrics).
	sync func() statesync.Status
	// programming is the Kubernetes services' programming latency.
	programming *metrics.Programming
}

// listenHTTP checks the web configuration and binds both addresses
// before the agent touches the node, so a taken port or a bad file fails
// the start with nothing changed. It returns nil when there is nothing to
// serve.
func listenHTTP(cfg WebConfig) (*httpServer, error) {
	if cfg.MetricsAddress == "" && cfg.HealthAddress == "" {
		return nil, nil
	}
	if cfg.WebConfigFile != "" {
		if err := web.Validate(cfg.WebConfigFile); err != nil {
			return nil, fmt.Errorf("--web-config-file %s: %w (see https://prometheus.io/docs/prometheus/latest/configuration/https/)", cfg.WebConfigFile, err)
		}
	} else if cfg.MetricsAddress != "" && !cfg.MetricsInsecure && !loopback(cfg.MetricsAddress) {
		return nil, fmt.Errorf("--metrics-address %s is reachable from other hosts and pods, and /metrics names every Service, its addresses and backends: give --web-config-file (TLS and authentication), serve on loopback (127.0.0.1:9464), or accept the exposure with --metrics-insecure", cfg.MetricsAddress)
	}
	h := &httpServer{cfg: cfg, programming: metrics.NewProgramming()}
	if cfg.MetricsAddress != "" {
		ln, err := net.Listen("tcp", cfg.MetricsAddress)
		if err != nil {
			return nil, fmt.Errorf("--metrics-address %s: %w (choose a free address, or \"\" to serve no metrics)", cfg.MetricsAddress, err)
		}
		h.ln = ln
	}
	if cfg.HealthAddress != "" {
		ln, err := net.Listen("tcp", cfg.HealthAddress)
		if err != nil {
			if h.ln != nil {
				h.ln.Close()
			}
			return nil, fmt.Errorf("--health-address %s: %w (choose a free address, or \"\" to serve no separate probes)", cfg.HealthAddress, err)
		}
		h.healthLn = ln
	}
	return h, nil
}

// loopback reports whether addr (host:port) is a loopback address.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (h *httpServer) probes(mux *http.ServeMux, dp *datapath.Datapath) {
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
}

// serve starts serving dp's metrics and probes; it returns at once.
func (h *httpServer) serve(dp *datapath.Datapath, name string, log *slog.Logger) {
	errLog := slog.NewLogLogger(log.Handler(), slog.LevelError)
	if h.ln != nil {
		reg := prometheus.NewRegistry()
		col := metrics.New(dp, func() (map[string]string, error) { return node.FrontendNames(name) }, func() ([]service.Skipped, error) { return node.SkippedServices(name) }, log).
			WithPolicyNames(func() (map[uint32]string, error) { return node.PolicyNames(name) }).
			WithWorkloadNames(func() (map[uint32]string, error) {
				rec, err := node.AppliedPorts(name)
				if err != nil {
					return nil, err
				}
				return rec.WorkloadNames(), nil
			})
		col.Refresh()
		if h.sync != nil {
			reg.MustRegister(metrics.NewSync(h.sync))
		}
		reg.MustRegister(
			col,
			h.programming,
			collectors.NewGoCollector(),
			collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		)
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: errLog}))
		h.probes(mux, dp)
		h.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: errLog}
		webCfg := h.cfg.WebConfigFile
		flags := &web.FlagConfig{WebConfigFile: &webCfg}
		go func() {
			if err := web.Serve(h.ln, h.srv, flags, log); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("serving metrics", "err", err)
			}
		}()
		log.Info("serving metrics", "address", h.ln.Addr().String(), "tls_and_auth", webCfg != "")
	}
	if h.healthLn != nil {
		mux := http.NewServeMux()
		h.probes(mux, dp)
		h.health = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: errLog}
		go func() {
			if err := h.health.Serve(h.healthLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("serving probes", "err", err)
			}
		}()
		log.Info("serving probes", "address", h.healthLn.Addr().String())
	}
}

func (h *httpServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, p := range []struct {
		srv *http.Server
		ln  net.Listener
	}{{h.srv, h.ln}, {h.health, h.healthLn}} {
		switch {
		case p.srv != nil:
			_ = p.srv.Shutdown(ctx)
		case p.ln != nil:
			p.ln.Close()
		}
	}
}
