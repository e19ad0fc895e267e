package node

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/bpffs"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/service"
	"github.com/socklane/socklane/internal/testutil"
)

// TestServiceJournal: updates apply and record only what changed (the
// whole record stays, the journal grows), what `svc list` reads is always
// the partitioner's whole answer, the journal is folded into a new whole
// record once it outgrows it, a line cut short is left out, and a record
// written by anybody else (another applier, a hand on the journal) makes
// the next update apply the whole set.
func TestServiceJournal(t *testing.T) {
	dp, cfg, name := serviceDatapath(t, "journal")
	dir := StateDir(name)
	rng := rand.New(rand.NewPCG(3, 4))
	part := service.NewPartitioner(service.Budget{})
	random := func(i int) *service.Service {
		s := &service.Service{Name: fmt.Sprintf("s%03d", i), VIPs: []netip.Addr{netip.AddrFrom4([4]byte{198, 19, 2, byte(i)})}, Ports: []service.Port{{Port: 80}}}
		for j := range 1 + rng.IntN(4) {
			s.Backends = append(s.Backends, service.Backend{IP: netip.AddrFrom4([4]byte{198, 18, 3, byte(1 + j + rng.IntN(4))})})
		}
		if i == 7 && rng.IntN(2) == 0 {
			s.Ports[0].Port = 0 // invalid: skipped
		}
		return s
	}
	for i := range 200 {
		part.Put(random(i))
	}
	part.Ignore(service.Skipped{Service: "default/other", Reason: "another proxy serves it", Ignored: true})
	update := func(what string, wantWhole bool) {
		t.Helper()
		st, whole, err := UpdateServices(dp, name, part.Flush(), part.Snapshot)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if whole != wantWhole {
			t.Fatalf("%s: applied whole %v, want %v (%+v)", what, whole, wantWhole, st)
		}
		set, skipped := part.Snapshot()
		gotSvcs, err := AppliedServices(name)
		if err != nil {
			t.Fatal(err)
		}
		gotSkipped, err := SkippedServices(name)
		if err != nil {
			t.Fatal(err)
		}
		if a, b := jsonOf(t, gotSvcs), jsonOf(t, set.Services); a != b {
			t.Fatalf("%s: the record holds\n%s\nthe partitioner\n%s", what, a, b)
		}
		if a, b := jsonOf(t, gotSkipped), jsonOf(t, skipped); a != b {
			t.Fatalf("%s: the record skips\n%s\nthe partitioner\n%s", what, a, b)
		}
		if st.Frontends != len(set.Services) {
			t.Fatalf("%s: %d frontends programmed, %d services served", what, st.Frontends, len(set.Services))
		}
	}
	update("first", true)
	base := fileTag(filepath.Join(dir, servicesFile))
	for batch := range 30 {
		for range 1 + rng.IntN(4) {
			if i := rng.IntN(220); rng.IntN(6) == 0 {
				part.Delete(fmt.Sprintf("default/s%03d", i))
			} else {
				part.Put(random(i))
			}
		}
		update(fmt.Sprintf("batch %d", batch), false)
		if fileTag(filepath.Join(dir, servicesFile)) != base {
			t.Fatalf("batch %d rewrote the whole record", batch)
		}
	}
	// Folded once the journal outgrows the whole (and 256 KiB).
	folded := false
	for i := 0; i < 20000 && !folded; i++ {
		part.Put(random(rng.IntN(200)))
		update(fmt.Sprintf("update %d", i), false)
		if _, err := os.Stat(filepath.Join(dir, serviceLogFile)); os.IsNotExist(err) {
			folded = true
			if fileTag(filepath.Join(dir, servicesFile)) == base {
				t.Fatal("the journal went, the whole record was not written")
			}
		}
	}
	if !folded {
		t.Fatal("the journal was never folded")
	}
	// A line cut short is left out; the hand on the journal makes the
	// next update whole.
	part.Put(random(1))
	update("before the cut", false)
	f, err := os.OpenFile(filepath.Join(dir, serviceLogFile), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"key":"default/s001","serv`); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if svcs, err := AppliedServices(name); err != nil || len(svcs) == 0 {
		t.Fatalf("a journal cut short: %d services, %v", len(svcs), err)
	}
	part.Put(random(2))
	update("after the cut", true)
	// Another applier (`svc apply` with its own handle) writes the
	// whole record: the next update is whole again.
	other, err := datapath.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	set, skipped := part.Snapshot()
	if _, err := ApplyServices(other, name, set, skipped); err != nil {
		t.Fatal(err)
	}
	other.Close()
	part.Put(random(3))
	update("after another applier", true)
	part.Put(random(4))
	update("and then", false)
}

// TestServiceUpdateCost: one changed Service of 10,000 through the whole
// chain an agent runs (partitioner, datapath, record), as an update and
// as a whole apply of the same set, interleaved; the update leaves the
// whole record alone and the record reads back the same either way.
func TestServiceUpdateCost(t *testing.T) {
	n := 10000
	if testing.Short() {
		n = 1000
	}
	dp, _, name := serviceDatapath(t, "cost")
	mk := func(i int, b byte) *service.Service {
		return &service.Service{Name: fmt.Sprintf("s%05d", i), VIPs: []netip.Addr{netip.AddrFrom4([4]byte{198, 19, byte((i + 1) >> 8), byte(i + 1)})},
			Ports:    []service.Port{{Port: 80}},
			Backends: []service.Backend{{IP: netip.AddrFrom4([4]byte{198, 18, 1, 1})}, {IP: netip.AddrFrom4([4]byte{198, 18, 1, b})}}}
	}
	part := service.NewPartitioner(dp.ServiceBudget())
	for i := range n {
		part.Put(mk(i, 2))
	}
	if _, whole, err := UpdateServices(dp, name, part.Flush(), part.Snapshot); err != nil || !whole {
		t.Fatalf("first apply: whole %v, %v", whole, err)
	}
	base := fileTag(filepath.Join(StateDir(name), servicesFile))
	var upd, all []time.Duration
	for i := range 7 {
		start := time.Now()
		part.Put(mk(i*97%n, byte(3+i)))
		_, whole, err := UpdateServices(dp, name, part.Flush(), part.Snapshot)
		if err != nil || whole {
			t.Fatalf("update %d: whole %v, %v", i, whole, err)
		}
		upd = append(upd, time.Since(start))
		if fileTag(filepath.Join(StateDir(name), servicesFile)) != base {
			t.Fatal("an update of one Service rewrote the whole record")
		}
		// The same change the way every apply went before: Partition
		// over the whole set, the datapath diffing it, the record
		// written whole.
		start = time.Now()
		part.Put(mk(i*97%n, byte(30+i)))
		part.Flush()
		snap, _ := part.Snapshot()
		set, skipped := service.Partition(snap.Services, dp.ServiceBudget())
		if _, err := ApplyServices(dp, name, set, skipped); err != nil {
			t.Fatal(err)
		}
		all = append(all, time.Since(start))
		base = fileTag(filepath.Join(StateDir(name), servicesFile))
	}
	slices.Sort(upd)
	slices.Sort(all)
	t.Logf("%d services, one changed: update %s (min %s, max %s), whole apply %s (min %s, max %s); medians of %d, interleaved",
		n, upd[len(upd)/2], upd[0], upd[len(upd)-1], all[len(all)/2], all[0], all[len(all)-1], len(upd))
	svcs, err := AppliedServices(name)
	if err != nil || len(svcs) != n {
		t.Fatalf("the record holds %d services (%v), want %d", len(svcs), err, n)
	}
}

// serviceDatapath is a datapath of its own and its state directory, both
// removed when the test ends.
func serviceDatapath(t *testing.T, what string) (*datapath.Datapath, datapath.Config, string) {
	t.Helper()
	testutil.RequireRoot(t)
	if err := bpffs.Ensure(bpffs.DefaultPath); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("sltest-%s-%d", what, os.Getpid())
	cfg := datapath.Config{PinDir: filepath.Join(bpffs.DefaultPath, name), Settings: datapath.DefaultSettings()}
	dp, err := datapath.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dp.Close()
		_ = dp.Remove()
		_ = os.RemoveAll(StateDir(name))
	})
	return dp, cfg, name
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) == "null" {
		return "[]"
	}
	return string(b)
}
