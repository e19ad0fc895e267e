package metrics

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/service"
)

// Source is the datapath as the collector reads it.
type Source interface {
	Counters() (datapath.Counts[datapath.Counter], error)
	Sockets() (int, error)
	ServiceStats() (*datapath.LBStats, error)
	TrackedSockets() (int, error)
	Programs() []*ebpf.Program
	Settings() (datapath.Settings, error)
	PolicyCounts() (map[uint32]datapath.PolicyCount, error)
	PortStats() (map[uint32]map[string]uint64, error)
}

// WorkloadNames maps port virtualization workload ids to names.
type WorkloadNames func() (map[uint32]string, error)

// PolicyNames maps the applied policies' ids to namespace/name.
type PolicyNames func() (map[uint32]string, error)

// maxPolicySeries bounds the policy label: policies beyond it are summed
// into "other".
const maxPolicySeries = 1000

// ServiceNames maps frontends (service.Frontend.String()) to the names of
// the services they belong to ("namespace/name").
type ServiceNames func() (map[string]string, error)

// SkippedServices lists the services the last apply left out.
type SkippedServices func() ([]service.Skipped, error)

// countsMaxAge bounds how old the table-walking gauges may be.
const countsMaxAge = 10 * time.Second

// tableCounts are the gauges that walk a table (the bypass map, the
// translated-socket table): too costly for a scrape at tens of thousands
// of entries, so they are counted in the background, at most every
// countsMaxAge, and a scrape serves the last count.
type tableCounts struct {
	mu               sync.Mutex
	sockets, tracked int
	err              error
	at               time.Time
	running          bool
}

// Collector reads the datapath's counters at scrape time.
type Collector struct {
	counts   tableCounts
	src      Source
	names    ServiceNames
	skipped  SkippedServices
	polNames PolicyNames
	wlNames  WorkloadNames
	descs    map[string]*prometheus.Desc
	errors   atomic.Uint64
	version  string
	log      *slog.Logger
}

// New returns a collector of src; names may be nil (services are then
// labelled by frontend only), and skipped too. log says why a scrape left
// a part out (nil: nowhere).
func New(src Source, names ServiceNames, skipped SkippedServices, log *slog.Logger) *Collector {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Collector{src: src, names: names, skipped: skipped, descs: map[string]*prometheus.Desc{}, version: version(), log: log}
	for _, f := range families {
		c.descs[f.name] = prometheus.NewDesc(f.fqName(), f.help, f.labels, nil)
	}
	return c
}

func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += "+" + s.Value[:12]
		}
	}
	return v
}

// Refresh counts the table-walking gauges now (the agent does it once
// before serving; scrapes then refresh them in the background).
func (c *Collector) Refresh() {
	sockets, err := c.src.Sockets()
	var tracked int
	if err == nil {
		tracked, err = c.src.TrackedSockets()
	}
	c.counts.mu.Lock()
	defer c.counts.mu.Unlock()
	c.counts.sockets, c.counts.tracked, c.counts.err, c.counts.at, c.counts.running = sockets, tracked, err, time.Now(), false
}

// tableCounts serves the last counts, starting a background count when
// they are older than countsMaxAge.
func (c *Collector) tableCounts() (sockets, tracked int, err error) {
	c.counts.mu.Lock()
	defer c.counts.mu.Unlock()
	if time.Since(c.counts.at) > countsMaxAge && !c.counts.running {
		c.counts.running = true
		go c.Refresh()
	}
	if c.counts.at.IsZero() {
		return 0, 0, errors.New("table counts not read yet")
	}
	return c.counts.sockets, c.counts.tracked, c.counts.err
}

// Describe sends every family's descriptor.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *Collector) emit(ch chan<- prometheus.Metric, f family, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(c.descs[f.name], f.typ, v, labels...)
}

// emitCounters sums BPF counters into their families: several counters
// can share one family (and label value) only if the table says so.
func (c *Collector) emitCounters(ch chan<- prometheus.Metric, vals map[string]uint64, refs map[string]counterRef) error {
	type key struct{ fam, label string }
	sums := map[key]float64{}
	fams := map[string]family{}
	for name, v := range vals {
		ref, ok := refs[name]
		if !ok {
			return fmt.Errorf("counter %q has no metric", name)
		}
		sums[key{ref.fam.name, ref.label}] += float64(v)
		fams[ref.fam.name] = ref.fam
	}
	for k, v := range sums {
		f := fams[k.fam]
		if len(f.labels) == 0 {
			c.emit(ch, f, v)
		} else {
			c.emit(ch, f, v, k.label)
		}
	}
	return nil
}

// Collect reads everything; a part that cannot be read is left out of
// this scrape, counted in collection_errors_total, and logged with why.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	failed := false
	fail := func(part string, err error) {
		failed = true
		c.log.Warn("scrape left a part out", "part", part, "err", err)
	}
	if vals, err := c.src.Counters(); err != nil {
		fail("counters", err)
	} else if err := c.emitCounters(ch, vals.Map(), bypassCounters); err != nil {
		fail("counters", err)
	}
	if sockets, tracked, err := c.tableCounts(); err != nil {
		fail("table counts", err)
	} else {
		c.emit(ch, famSockets, float64(sockets))
		c.emit(ch, famLBTracked, float64(tracked))
	}
	if st, err := c.src.ServiceStats(); err != nil {
		fail("services", err)
	} else if err := c.collectServices(ch, st); err != nil {
		fail("services", err)
	}
	for _, p := range c.src.Programs() {
		info, err := p.Info()
		if err != nil {
			fail("program info", err)
			continue
		}
		st, err := p.Stats()
		if err != nil {
			fail("program stats", err)
			continue
		}
		c.emit(ch, famProgRuns, float64(st.RunCount), info.Name)
		c.emit(ch, famProgSeconds, st.Runtime.Seconds(), info.Name)
	}
	if err := c.collectPolicies(ch); err != nil {
		fail("policies", err)
	}
	if err := c.collectPorts(ch); err != nil {
		fail("ports", err)
	}
	if s, err := c.src.Settings(); err != nil {
		fail("settings", err)
	} else {
		c.emit(ch, famSetting, float64(s.BacklogLimit), "backlog_limit_bytes")
		c.emit(ch, famSetting, float64(s.VerdictWindow), "verdict_window_bytes")
		blocking := boolValue(s.BypassBlocking.On())
		if s.BypassBlocking == datapath.ModeProcess {
			blocking = 0.5
		}
		c.emit(ch, famSetting, blocking, "bypass_blocking")
		c.emit(ch, famSetting, boolValue(s.BypassBrief.On()), "bypass_brief")
		c.emit(ch, famSetting, boolValue(s.BypassSmallStreams.On()), "bypass_small_streams")
		c.emit(ch, famSetting, boolValue(s.BacklogValve.On()), "backlog_valve")
		c.emit(ch, famSetting, boolValue(s.LateVerdict.On()), "late_verdict")
	}
	if failed {
		c.errors.Add(1)
	}
	c.emit(ch, famCollectErr, float64(c.errors.Load()))
	c.emit(ch, famBuild, 1, c.version, runtime.Version())
}

func (c *Collector) collectServices(ch chan<- prometheus.Metric, st *datapath.LBStats) error {
	if err := c.emitCounters(ch, st.Counters.Map(), lbCounters); err != nil {
		return err
	}
	var names map[string]string
	if c.names != nil {
		var err error
		if names, err = c.names(); err != nil {
			return err
		}
	}
	for _, s := range st.Selections {
		c.emit(ch, famLBSelected, float64(s.Count), names[s.Frontend.String()], s.Frontend.String(), s.Backend.String())
	}
	for f, n := range st.Refused {
		c.emit(ch, famLBRefused, float64(n), names[f], f)
	}
	if c.skipped != nil {
		skipped, err := c.skipped()
		if err != nil {
			return err
		}
		for _, s := range skipped {
			if s.Ignored {
				continue // not served by design: nothing to alert on
			}
			c.emit(ch, famSvcSkipped, 1, s.Service)
		}
	}
	return nil
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// WithPolicyNames names the policies of policy_verdicts_total.
func (c *Collector) WithPolicyNames(fn PolicyNames) *Collector {
	c.polNames = fn
	return c
}

func (c *Collector) collectPolicies(ch chan<- prometheus.Metric) error {
	counts, err := c.src.PolicyCounts()
	if err != nil || len(counts) == 0 {
		return err
	}
	names := map[uint32]string{}
	if c.polNames != nil {
		if names, err = c.polNames(); err != nil {
			return err
		}
	}
	ids := make([]uint32, 0, len(counts))
	for id := range counts {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	type key struct{ policy, verdict string }
	sums := map[key]float64{}
	for i, id := range ids {
		name := names[id]
		if name == "" {
			name = fmt.Sprintf("id-%d", id)
		}
		if i >= maxPolicySeries {
			name = "other"
		}
		sums[key{name, "allowed"}] += float64(counts[id].Allowed)
		sums[key{name, "denied"}] += float64(counts[id].Denied)
	}
	for k, v := range sums {
		c.emit(ch, famPolVerdict, v, k.policy, k.verdict)
	}
	return nil
}

// WithWorkloadNames names the workloads of port_events_total.
func (c *Collector) WithWorkloadNames(fn WorkloadNames) *Collector {
	c.wlNames = fn
	return c
}

// collectPorts emits the per-workload port counters (id 0, sockets of no
// workload, as "-"), the label bounded as the policies' is.
func (c *Collector) collectPorts(ch chan<- prometheus.Metric) error {
	stats, err := c.src.PortStats()
	if err != nil || len(stats) == 0 {
		return err
	}
	names := map[uint32]string{}
	if c.wlNames != nil {
		if names, err = c.wlNames(); err != nil {
			return err
		}
	}
	ids := make([]uint32, 0, len(stats))
	for id := range stats {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	type key struct{ workload, event string }
	sums := map[key]float64{}
	for i, id := range ids {
		name := names[id]
		switch {
		case id == 0:
			name = "-"
		case name == "":
			name = fmt.Sprintf("id-%d", id)
		}
		if i > maxPolicySeries {
			name = "other"
		}
		for ev, v := range stats[id] {
			sums[key{name, ev}] += float64(v)
		}
	}
	for k, v := range sums {
		c.emit(ch, famPortEvents, v, k.workload, k.event)
	}
	return nil
}
