package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/socklane/socklane/internal/statesync"
)

// TestSyncFamilies: every sync family is served, with the peers and
// tables of the status as labels.
func TestSyncFamilies(t *testing.T) {
	st := statesync.Status{
		Active:   true,
		Peers:    []statesync.PeerStatus{{Name: "node-b", Connected: true, LagSeconds: 0.25, Behind: 3}},
		Tables:   []statesync.TableStatus{{Name: "flows", Entries: 42}},
		Counters: statesync.Counters{Published: 5, Applied: 7, Resyncs: 1},
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewSync(func() statesync.Status { return st }))
	got, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]float64{}
	for _, mf := range got {
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += "," + l.GetValue()
			}
			byName[key] = v
		}
	}
	for _, f := range syncFamilies {
		found := false
		for k := range byName {
			if k == f.fqName() || len(k) > len(f.fqName()) && k[:len(f.fqName())+1] == f.fqName()+"," {
				found = true
			}
		}
		if !found {
			t.Errorf("%s not served", f.fqName())
		}
	}
	for key, want := range map[string]float64{
		"socklane_sync_updates_total,published": 5, "socklane_sync_updates_total,applied": 7,
		"socklane_sync_peer_up,node-b": 1, "socklane_sync_peer_lag_seconds,node-b": 0.25,
		"socklane_sync_peer_behind,node-b": 3, "socklane_sync_entries,flows": 42, "socklane_sync_active": 1,
		"socklane_sync_resyncs_total": 1,
	} {
		if byName[key] != want {
			t.Errorf("%s = %v, want %v", key, byName[key], want)
		}
	}
}
