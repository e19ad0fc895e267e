package metrics

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Markdown writes the reference of every metric (docs/metrics.md).
func Markdown(w io.Writer) {
	fmt.Fprintln(w, "# socklane metrics")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Generated from internal/metrics (`make metrics-doc`); do not edit.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "The agent serves them at `/metrics` on `--metrics-address` (default")
	fmt.Fprintln(w, "127.0.0.1:9464). Counters are read from the datapath's per-CPU BPF maps at")
	fmt.Fprintln(w, "scrape time; nothing is counted twice and no label names a connection.")
	fmt.Fprintln(w, "Per-service series have one series per service frontend and backend.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "They name every Service, its addresses and backends, so the agent serves")
	fmt.Fprintln(w, "them where other hosts and pods can connect only with `--web-config-file`")
	fmt.Fprintln(w, "(the Prometheus exporter web configuration: TLS, client certificates,")
	fmt.Fprintln(w, "basic auth users; the Helm chart's `metricsWebConfigSecret`) or with")
	fmt.Fprintln(w, "`--metrics-insecure`. Probes use `--health-address` (`/healthz`, `/readyz`")
	fmt.Fprintln(w, "only, no credentials; the manifests put it on the node's loopback).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "A scrape reads counters only: the gauges that count table entries")
	fmt.Fprintln(w, "(`socklane_bypassed_sockets`, `socklane_lb_tracked_sockets`) are counted by")
	fmt.Fprintln(w, "the agent in the background at most every 10 s and served as of then.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| metric | type | labels | meaning |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, f := range append(slices.Clone(families), syncFamilies...) {
		typ := "counter"
		if f.typ == prometheus.GaugeValue {
			typ = "gauge"
		}
		var labels []string
		for _, l := range f.labels {
			if vals := labelValues(f); len(vals) > 0 && len(f.labels) == 1 {
				labels = append(labels, fmt.Sprintf("`%s` (%s)", l, strings.Join(vals, ", ")))
			} else {
				labels = append(labels, "`"+l+"`")
			}
		}
		fmt.Fprintf(w, "| `%s` | %s | %s | %s |\n", f.fqName(), typ, strings.Join(labels, ", "), f.help)
	}
	fmt.Fprintf(w, "| `%s_service_programming_seconds` | histogram (1 ms to %gs) |  | %s |\n", namespace, programmingBuckets[len(programmingBuckets)-1], programmingHelp)
}

// labelValues lists the label values BPF counters give a family.
func labelValues(f family) []string {
	var out []string
	for _, refs := range []map[string]counterRef{bypassCounters, lbCounters} {
		for _, r := range refs {
			if r.fam.name == f.name && r.label != "" && !slices.Contains(out, r.label) {
				out = append(out, r.label)
			}
		}
	}
	slices.Sort(out)
	return out
}
