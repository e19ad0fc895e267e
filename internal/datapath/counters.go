package datapath

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// Counter is one of the datapath's counters: enum sl_counter, generated
// from the C (sl_consts.h), the only place counters are defined.
type Counter = bypassSlCounter

// LBCounter is one of the service load balancer's: enum sl_lb_counter.
type LBCounter = servicelbSlLbCounter

// The counters other packages read by name, as the generated identifiers.
const (
	CounterConnsBypassed    = bypassSlCounterSL_C_CONNS_BYPASSED
	CounterConnsTCP         = bypassSlCounterSL_C_CONNS_TCP
	CounterRedirectMsgs     = bypassSlCounterSL_C_REDIRECT_MSGS
	CounterRedirectBytes    = bypassSlCounterSL_C_REDIRECT_BYTES
	CounterPassMsgs         = bypassSlCounterSL_C_PASS_MSGS
	CounterPassBytes        = bypassSlCounterSL_C_PASS_BYTES
	CounterFallbackBacklog  = bypassSlCounterSL_C_FALLBACK_BACKLOG
	CounterFallbackSmall    = bypassSlCounterSL_C_FALLBACK_SMALL_STREAM
	CounterValveOpens       = bypassSlCounterSL_C_VALVE_OPENS
	CounterValveBytes       = bypassSlCounterSL_C_VALVE_BYTES
	CounterLateVerdicts     = bypassSlCounterSL_C_LATE_VERDICTS
	LBCounterSelected       = servicelbSlLbCounterSL_LB_SELECTED
	LBCounterPolFirstPacket = servicelbSlLbCounterSL_LB_POL_FIRST_PACKET
	LBCounterPolDenied      = servicelbSlLbCounterSL_LB_POL_DENIED_CONNECT
)

// Counts are per-CPU counters summed over the CPUs, indexed by their C
// enum, with the enum's names as read from the object's BTF at open (the
// keys of their JSON and of Map).
type Counts[K Counter | LBCounter] struct {
	sums  []uint64
	names []string
}

// Get is counter k (0 for one this datapath does not have).
func (c Counts[K]) Get(k K) uint64 {
	if int(k) < len(c.sums) {
		return c.sums[k]
	}
	return 0
}

// Since is c minus before, counter by counter.
func (c Counts[K]) Since(before Counts[K]) Counts[K] {
	d := Counts[K]{sums: make([]uint64, len(c.sums)), names: c.names}
	for i, v := range c.sums {
		d.sums[i] = v - before.Get(K(i))
	}
	return d
}

// Map keys the counts by name.
func (c Counts[K]) Map() map[string]uint64 {
	out := make(map[string]uint64, len(c.names))
	for i, n := range c.names {
		if n != "" && i < len(c.sums) {
			out[n] = c.sums[i]
		}
	}
	return out
}

// MarshalJSON writes the counts as an object keyed by name.
func (c Counts[K]) MarshalJSON() ([]byte, error) { return json.Marshal(c.Map()) }

// CountsOf builds counts from values keyed by name (readers of another
// process's JSON, and tests); a name the enum lacks is an error.
func CountsOf[K Counter | LBCounter](values map[string]uint64) (Counts[K], error) {
	names, err := namesOf[K]()
	if err != nil {
		return Counts[K]{}, err
	}
	c := Counts[K]{sums: make([]uint64, len(names)), names: names}
	for name, v := range values {
		i := -1
		for j, n := range names {
			if n == name {
				i = j
			}
		}
		if i < 0 {
			return Counts[K]{}, fmt.Errorf("no counter named %q", name)
		}
		c.sums[i] = v
	}
	return c, nil
}

func namesOf[K Counter | LBCounter]() ([]string, error) {
	var k K
	if _, ok := any(k).(Counter); ok {
		return CounterNames()
	}
	return LBCounterNames()
}

// CounterNames returns the datapath's counter names, indexed by enum
// sl_counter, read from the object's BTF (the C enum is the only definition).
func CounterNames() ([]string, error) {
	spec, err := loadBypass()
	if err != nil {
		return nil, fmt.Errorf("loading embedded BPF object: %w", err)
	}
	return enumNames(spec, "sl_counter", "SL_C_", len(bypassSlCounters{}.C))
}

// LBCounterNames is CounterNames for the service load balancer.
func LBCounterNames() ([]string, error) {
	spec, err := loadServicelb()
	if err != nil {
		return nil, fmt.Errorf("loading embedded BPF object: %w", err)
	}
	return enumNames(spec, "sl_lb_counter", "SL_LB_", len(servicelbSlLbCounters{}.C))
}

// enumNames lower-cases a C enum's value names without their prefix.
func enumNames(spec *ebpf.CollectionSpec, enum, prefix string, n int) ([]string, error) {
	var e *btf.Enum
	if err := spec.Types.TypeByName(enum, &e); err != nil {
		return nil, fmt.Errorf("finding enum %s: %w", enum, err)
	}
	names := make([]string, n)
	for _, v := range e.Values {
		if v.Value < uint64(len(names)) {
			names[v.Value] = strings.ToLower(strings.TrimPrefix(v.Name, prefix))
		}
	}
	return names, nil
}

// sumCounters reads a per-CPU counter block (one entry, key 0) and sums
// it over the CPUs: the result is indexed by the counters' C enum.
func sumCounters[K Counter | LBCounter, B bypassSlCounters | servicelbSlLbCounters](m *ebpf.Map, names []string, counters func(*B) []uint64) (Counts[K], error) {
	var perCPU []B
	if err := m.Lookup(uint32(0), &perCPU); err != nil {
		return Counts[K]{}, fmt.Errorf("reading %s: %w", m, err)
	}
	sum := Counts[K]{names: names}
	for i := range perCPU {
		c := counters(&perCPU[i])
		if sum.sums == nil {
			sum.sums = make([]uint64, len(c))
		}
		for j, v := range c {
			sum.sums[j] += v
		}
	}
	return sum, nil
}

// Counters sums the datapath's per-CPU counters.
func (d *Datapath) Counters() (Counts[Counter], error) {
	return sumCounters[Counter](d.objs.SlStats, d.counterNames, func(b *bypassSlCounters) []uint64 { return b.C[:] })
}

// LBCounters sums the load balancer's.
func (d *Datapath) LBCounters() (Counts[LBCounter], error) {
	return sumCounters[LBCounter](d.lb.SlLbStats, d.lbCounterNames, func(b *servicelbSlLbCounters) []uint64 { return b.C[:] })
}
