package metrics

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"log/slog"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/service"
	"github.com/socklane/socklane/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite docs/metrics.md")

// TestEveryCounterHasMetric: a counter added to the C enums without a
// metric fails here.
func TestEveryCounterHasMetric(t *testing.T) {
	for _, tc := range []struct {
		name  string
		names func() ([]string, error)
		refs  map[string]counterRef
	}{
		{"sl_counter", datapath.CounterNames, bypassCounters},
		{"sl_lb_counter", datapath.LBCounterNames, lbCounters},
	} {
		t.Run(tc.name, func(t *testing.T) {
			names, err := tc.names()
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]bool{}
			for _, n := range names {
				if n == "" {
					continue
				}
				seen[n] = true
				if _, ok := tc.refs[n]; !ok {
					t.Errorf("counter %s has no metric", n)
				}
			}
			for n := range tc.refs {
				if !seen[n] {
					t.Errorf("metric table names counter %s, which the datapath lacks", n)
				}
			}
		})
	}
}

type fakeSource struct {
	counters datapath.Counts[datapath.Counter]
	lb       *datapath.LBStats
	err      error
}

func (f *fakeSource) Counters() (datapath.Counts[datapath.Counter], error) {
	return f.counters, f.err
}
func (f *fakeSource) Sockets() (int, error)                    { return 4, nil }
func (f *fakeSource) TrackedSockets() (int, error)             { return 2, nil }
func (f *fakeSource) ServiceStats() (*datapath.LBStats, error) { return f.lb, nil }
func (f *fakeSource) Programs() []*ebpf.Program                { return nil }
func (f *fakeSource) PolicyCounts() (map[uint32]datapath.PolicyCount, error) {
	return map[uint32]datapath.PolicyCount{3: {Allowed: 5, Denied: 2}}, nil
}

func (f *fakeSource) PortStats() (map[uint32]map[string]uint64, error) {
	return map[uint32]map[string]uint64{0: {"direct": 1}, 2: {"binds": 3, "exhausted": 1}, 9: {"binds": 1}}, nil
}

func (f *fakeSource) Settings() (datapath.Settings, error) {
	return datapath.Settings{BacklogLimit: 1 << 20, VerdictWindow: 4096, BypassBrief: datapath.ModeOn}, nil
}

// counts builds counters by name; a name the C enum lacks fails the test.
func counts[K datapath.Counter | datapath.LBCounter](t *testing.T, byName map[string]uint64) datapath.Counts[K] {
	t.Helper()
	c, err := datapath.CountsOf[K](byName)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func scrape(t *testing.T, c *Collector) (string, map[string]float64) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering: %v", err)
	}
	var buf bytes.Buffer
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&buf, mf); err != nil {
			t.Fatal(err)
		}
	}
	vals, err := testutil.ParseMetrics(buf.String())
	if err != nil {
		t.Fatalf("the exposition does not parse: %v\n%s", err, buf.String())
	}
	return buf.String(), vals
}

func TestCollector(t *testing.T) {
	fe := service.Frontend{VIP: netip.MustParseAddr("198.19.0.10"), Port: 80, Protocol: service.TCP}
	src := &fakeSource{
		counters: counts[datapath.Counter](t, map[string]uint64{"redirect_bytes": 12345, "fallback_backlog": 3, "established_active": 7}),
		lb: &datapath.LBStats{
			Counters:   counts[datapath.LBCounter](t, map[string]uint64{"selected": 9, "err_conns": 1}),
			Selections: []datapath.Selection{{Frontend: fe, Backend: netip.MustParseAddrPort("198.18.1.2:8080"), Count: 9}},
			Refused:    map[string]uint64{fe.String(): 5},
		},
	}
	names := func() (map[string]string, error) { return map[string]string{fe.String(): "default/web"}, nil }
	skipped := func() ([]service.Skipped, error) {
		return []service.Skipped{{Service: "default/huge", Reason: "backends: 20000 backends, at most 16384"}}, nil
	}
	var logged bytes.Buffer
	c := New(src, names, skipped, slog.New(slog.NewTextHandler(&logged, nil))).WithPolicyNames(func() (map[uint32]string, error) {
		return map[uint32]string{3: "x/deny"}, nil
	}).WithWorkloadNames(func() (map[uint32]string, error) {
		return map[uint32]string{2: "redis-a"}, nil
	})
	c.Refresh()
	text, vals := scrape(t, c)
	for key, want := range map[string]float64{
		"socklane_redirected_bytes_total":                    12345,
		"socklane_fallbacks_total,reason=backlog":            3,
		"socklane_connections_established_total,role=client": 7,
		"socklane_bypassed_sockets":                          4,
		"socklane_lb_tracked_sockets":                        2,
		"socklane_lb_events_total,event=selected":            9,
		"socklane_lb_errors_total,error=conns_table":         1,
		"socklane_lb_backend_selections_total,backend=198.18.1.2:8080,frontend=198.19.0.10:80/TCP,service=default/web": 9,
		"socklane_lb_no_backend_total,frontend=198.19.0.10:80/TCP,service=default/web":                                 5,
		"socklane_datapath_setting,setting=backlog_limit_bytes":                                                        1 << 20,
		"socklane_datapath_setting,setting=verdict_window_bytes":                                                       4096,
		"socklane_datapath_setting,setting=bypass_blocking":                                                            0,
		"socklane_datapath_setting,setting=bypass_brief":                                                               1,
		"socklane_collection_errors_total":                                                                             0,
		"socklane_service_skipped,service=default/huge":                                                                1,
		"socklane_policy_verdicts_total,policy=x/deny,verdict=denied":                                                  2,
		"socklane_policy_verdicts_total,policy=x/deny,verdict=allowed":                                                 5,
		"socklane_port_events_total,event=binds,workload=redis-a":                                                      3,
		"socklane_port_events_total,event=exhausted,workload=redis-a":                                                  1,
		"socklane_port_events_total,event=binds,workload=id-9":                                                         1,
		"socklane_port_events_total,event=direct,workload=-":                                                           1,
	} {
		if got, ok := vals[key]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v\n%s", key, got, ok, want, text)
		}
	}

	// A datapath that cannot be read: the rest is still served, and the
	// error is counted.
	src.err = errors.New("map gone")
	_, vals = scrape(t, c)
	if vals["socklane_collection_errors_total"] != 1 {
		t.Errorf("collection_errors_total = %v after a failed read, want 1", vals["socklane_collection_errors_total"])
	}
	if _, ok := vals["socklane_lb_tracked_sockets"]; !ok {
		t.Errorf("a failed counter read dropped the other metrics")
	}
	if !strings.Contains(logged.String(), "part=counters err=\"map gone\"") {
		t.Errorf("the failed read is not logged with its part and error: %q", logged.String())
	}
}

// TestDoc keeps docs/metrics.md generated from the families
// (`go test ./internal/metrics -run TestDoc -update` rewrites it).
func TestDoc(t *testing.T) {
	var buf bytes.Buffer
	Markdown(&buf)
	const path = "../../docs/metrics.md"
	if *update {
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (generate it with `make metrics-doc`)", err)
	}
	if !bytes.Equal(got, buf.Bytes()) {
		t.Errorf("docs/metrics.md is stale: run `make metrics-doc`")
	}
}

// TestDashboard: every socklane metric the Grafana dashboard queries is
// one the collector exports.
func TestDashboard(t *testing.T) {
	b, err := os.ReadFile("../../deploy/grafana/socklane-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("parsing the dashboard: %v", err)
	}
	known := map[string]bool{}
	for _, f := range families {
		known[f.fqName()] = true
	}
	re := regexp.MustCompile(`socklane_[a-z_]+`)
	n := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, m := range re.FindAllString(tg.Expr, -1) {
				n++
				if !known[m] {
					t.Errorf("panel %q queries %s, which socklane does not export", p.Title, m)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("the dashboard queries no socklane metric")
	}
}
