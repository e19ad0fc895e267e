package e2e

import (
	"fmt"
	"testing"

	"github.com/socklane/socklane/internal/testbed"
	"github.com/socklane/socklane/internal/testutil"
)

// TestServiceMaglev: with selection: Maglev a client pod keeps one
// backend over its connects without any per-client state (no affinity
// entries), pods spread over the backends, removing a backend moves only
// the pods that were on it, and re-adding it restores every pod's
// backend.
func TestServiceMaglev(t *testing.T) {
	lb := newLBBed(t)
	b := lb.bed
	be2 := testutil.Pod(t, b, "be2")
	start(t, be2, lb.in.Bin, "peer", "whoami", "[::]:8080", "--network", "tcp", "--label", "be2")
	waitPort(t, be2, "[::]:8080")
	lb.in.Attach(be2)
	backends := []string{lb.back[0].IPv4.String(), lb.back[1].IPv4.String(), be2.IPv4.String()}
	apply := func(bes ...string) {
		t.Helper()
		list := ""
		for _, ip := range bes {
			list += fmt.Sprintf("{ip: %s}, ", ip)
		}
		lb.apply(t, fmt.Sprintf("services:\n  - name: hashed\n    vips: [198.19.0.31]\n    ports: [{port: 80, targetPort: 8080}]\n    selection: Maglev\n    backends: [%s]\n", list))
	}
	apply(backends...)
	n := 12
	if testing.Short() {
		n = 6 // emulated kernels: each pod takes seconds
	}
	clients := make([]*testbed.Pod, n)
	for i := range clients {
		clients[i] = testutil.Pod(t, b, fmt.Sprintf("mg%d", i))
		lb.in.Attach(clients[i])
	}
	// where maps each pod to the one backend its connects reached.
	where := func() []string {
		t.Helper()
		out := make([]string, n)
		for i, c := range clients {
			r := lb.probe(t, c, "tcp", "198.19.0.31:80", 3)
			if len(r.Replies) != 1 || len(r.Errors) != 0 {
				t.Fatalf("pod mg%d spread over %v (%v): Maglev keeps a client's backend", i, r.Replies, r.Errors)
			}
			for be := range r.Replies {
				out[i] = be
			}
		}
		return out
	}
	first := where()
	used := map[string]int{}
	for _, be := range first {
		used[be]++
	}
	if len(used) < 2 {
		t.Errorf("%d pods all on %v: Maglev should spread pods over backends", n, used)
	}
	if e := lb.in.MapEntries("sl_svc_affinity"); e != 0 {
		t.Errorf("%d affinity entries: Maglev keeps no per-client state", e)
	}
	// be2 leaves: only its pods move.
	apply(backends[:2]...)
	second := where()
	for i := range first {
		if first[i] != "be2" && second[i] != first[i] {
			t.Errorf("pod mg%d moved from %s to %s when be2 left", i, first[i], second[i])
		}
		if second[i] == "be2" {
			t.Errorf("pod mg%d still reaches be2 after it left", i)
		}
	}
	// be2 back: every pod where it was.
	apply(backends...)
	third := where()
	for i := range first {
		if third[i] != first[i] {
			t.Errorf("pod mg%d on %s, then %s after be2 came back", i, first[i], third[i])
		}
	}
	t.Logf("pods per backend: %v", used)
}
