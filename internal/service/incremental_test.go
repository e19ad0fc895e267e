package service

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"
)

// TestPartitionerAgreesWithPartition: after every batch of changes the
// incremental answer is Partition's over the whole set, and the outcomes
// Flush returns carry a caller from the last answer to this one. The
// services share a few addresses (clashes chain through them), some are
// invalid or ignored, some Maglev; the budgets go from unbounded to
// tight, so that the tables fill and empty during the run.
func TestPartitionerAgreesWithPartition(t *testing.T) {
	budgets := []Budget{{}, {Frontends: 40, BackendSlots: 400, MaglevTables: 12}, {Frontends: 12, BackendSlots: 90, MaglevTables: 4}}
	for seed := range uint64(30) {
		budget := budgets[seed%uint64(len(budgets))]
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			p := NewPartitioner(budget)
			defs := map[string]*Service{}
			ignored := map[string]Skipped{}
			view := map[string]Outcome{} // what a caller of Flush holds
			for batch := range 120 {
				for range 1 + rng.IntN(6) {
					name := fmt.Sprintf("s%02d", rng.IntN(30))
					key := "default/" + name
					switch r := rng.IntN(10); {
					case r < 6:
						s := randomService(rng, name)
						delete(ignored, key)
						defs[key] = s
						p.Put(s)
					case r < 8:
						delete(defs, key)
						delete(ignored, key)
						p.Delete(key)
					default:
						delete(defs, key)
						sk := Skipped{Service: key, Reason: "another proxy's", Ignored: true}
						ignored[key] = sk
						p.Ignore(sk)
					}
				}
				for _, o := range p.Flush() {
					if o.Service == nil && o.Skipped == nil {
						delete(view, o.Key)
					} else {
						view[o.Key] = o
					}
				}
				var all []*Service
				for _, s := range defs {
					all = append(all, s)
				}
				wantSet, wantSkipped := Partition(all, budget)
				for _, sk := range ignored {
					wantSkipped = append(wantSkipped, sk)
				}
				slices.SortFunc(wantSkipped, func(a, b Skipped) int { return compareKeys(a.Service, b.Service) })
				gotSet, gotSkipped := p.Snapshot()
				if !reflect.DeepEqual(keysOf(gotSet), keysOf(wantSet)) {
					t.Fatalf("batch %d: served %v, Partition serves %v", batch, keysOf(gotSet), keysOf(wantSet))
				}
				if !reflect.DeepEqual(gotSkipped, wantSkipped) && (len(gotSkipped) != 0 || len(wantSkipped) != 0) {
					t.Fatalf("batch %d: skipped\n%v\nPartition skips\n%v", batch, gotSkipped, wantSkipped)
				}
				// The caller's view, from the outcomes alone.
				var viewSet []string
				var viewSkipped []Skipped
				for _, o := range view {
					if o.Service != nil {
						viewSet = append(viewSet, o.Key)
						if defs[o.Key] != o.Service {
							t.Fatalf("batch %d: %s is served with an old definition", batch, o.Key)
						}
					} else {
						viewSkipped = append(viewSkipped, *o.Skipped)
					}
				}
				slices.Sort(viewSet)
				slices.SortFunc(viewSkipped, func(a, b Skipped) int { return compareKeys(a.Service, b.Service) })
				if !reflect.DeepEqual(viewSet, keysOf(wantSet)) || len(viewSkipped) != len(wantSkipped) || len(wantSkipped) > 0 && !reflect.DeepEqual(viewSkipped, wantSkipped) {
					t.Fatalf("batch %d: the outcomes add up to\n%v %v\nnot\n%v %v", batch, viewSet, viewSkipped, keysOf(wantSet), wantSkipped)
				}
			}
		})
	}
}

func compareKeys(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func keysOf(set *Set) []string {
	var out []string
	for _, s := range set.Services {
		out = append(out, s.Key())
	}
	return out
}

// randomService shares its addresses with others (8 of them, two ports):
// clashes are frequent and chain.
func randomService(rng *rand.Rand, name string) *Service {
	s := &Service{Name: name}
	for range 1 + rng.IntN(2) {
		vip := netip.AddrFrom4([4]byte{198, 19, 0, byte(1 + rng.IntN(8))})
		if !slices.Contains(s.VIPs, vip) && (len(s.VIPs) == 0 || rng.IntN(2) == 0) {
			s.VIPs = append(s.VIPs, vip)
		}
	}
	if rng.IntN(6) == 0 {
		s.VIPs = append(s.VIPs, netip.MustParseAddr(fmt.Sprintf("2001:db8::%x", 1+rng.IntN(8))))
		s.VIPs = s.VIPs[len(s.VIPs)-1:]
	}
	ports := []uint16{80, 443}
	for i := range 1 + rng.IntN(2) {
		s.Ports = append(s.Ports, Port{Name: fmt.Sprintf("p%d", i), Port: ports[(i+rng.IntN(2))%2]})
	}
	if rng.IntN(15) == 0 {
		s.Ports[0].Port = 0 // invalid
	}
	if rng.IntN(5) == 0 {
		s.Selection = SelectMaglev
	}
	for i := range rng.IntN(12) {
		ip := netip.AddrFrom4([4]byte{198, 18, 0, byte(1 + i)})
		if s.VIPs[0].Is6() {
			ip = netip.MustParseAddr(fmt.Sprintf("2001:db8:1::%x", 1+i))
		}
		s.Backends = append(s.Backends, Backend{IP: ip})
	}
	return s
}
