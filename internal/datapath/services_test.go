package datapath

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/bpffs"
	"github.com/socklane/socklane/internal/service"
	"github.com/socklane/socklane/internal/testutil"
)

func testDatapath(t *testing.T) *Datapath {
	t.Helper()
	return testDatapathWith(t, Config{PinDir: filepath.Join("/sys/fs/bpf", fmt.Sprintf("sltest-dp-%d", os.Getpid())), Settings: Settings{Bypass: ModeOn, VerdictWindow: DefaultVerdictWindow}})
}

// testDatapathWith loads a datapath with cfg, removed when the test ends.
func testDatapathWith(t *testing.T, cfg Config) *Datapath {
	t.Helper()
	testutil.RequireRoot(t)
	if err := bpffs.Ensure("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	dp, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dp.Close()
		if err := dp.Remove(); err != nil {
			t.Errorf("removing test datapath: %v", err)
		}
	})
	return dp
}

// manyServices is n services on 198.19.0.0/16, two backends each; the
// first changed of them use a different second backend.
func manyServices(t *testing.T, n, changed int) *service.Set {
	t.Helper()
	var b strings.Builder
	b.WriteString("services:\n")
	for i := range n {
		second := "198.18.1.2"
		if i < changed {
			second = "198.18.1.3"
		}
		fmt.Fprintf(&b, "  - name: s%d\n    vips: [%s]\n    ports: [{port: 80, targetPort: 8080}]\n    backends: [{ip: 198.18.1.1}, {ip: %s}]\n",
			i, netip.AddrFrom4([4]byte{198, 19, byte((i + 1) >> 8), byte(i + 1)}), second)
	}
	set, err := service.Parse([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func entries(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	next := make([]byte, m.KeySize())
	var key any // nil: the first key
	for n := 0; ; n++ {
		if err := m.NextKey(key, next); errors.Is(err, ebpf.ErrKeyNotExist) {
			return n
		} else if err != nil {
			t.Fatal(err)
		}
		key = slices.Clone(next)
	}
}

// TestApplyServicesMaps applies 10,000 services, again unchanged, with half
// of them changed, and none, and checks every map's contents each time:
// removed members and services leave, a changed frontend's previous bank
// stays until its next change, nothing else does.
func TestApplyServicesMaps(t *testing.T) {
	dp := testDatapath(t)
	// The kernel matrix runs this with -test.short: the scale is the
	// host's to prove (each map write is emulated in the guests).
	n := 10000
	if testing.Short() {
		n = 1000
	}
	steps := []struct {
		name                                string
		set                                 *service.Set
		added, updated, removed, stale      int
		frontends, backends, members, refus int
	}{
		{"create", manyServices(t, n, 0), n, 0, 0, 0, n, 2 * n, 2 * n, n},
		{"unchanged", manyServices(t, n, 0), 0, 0, 0, 0, n, 2 * n, 2 * n, n},
		// A changed frontend's previous bank stays (2 slots each) for
		// connects that read the frontend before the switch.
		{"half changed", manyServices(t, n, n/2), 0, n / 2, 0, n / 2, n, 3 * n, 2 * n, n},
		{"changed back", manyServices(t, n, 0), 0, n / 2, 0, n / 2, n, 3 * n, 2 * n, n},
		{"none", &service.Set{}, 0, 0, n, 2 * n, 0, 0, 0, 0},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			st, err := dp.ApplyServices(s.set)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d frontends, %d added, %d updated, %d removed, %d stale, in %s", s.name, st.Frontends, st.Added, st.Updated, st.Removed, st.Stale, st.Took)
			if st.Added != s.added || st.Updated != s.updated || st.Removed != s.removed || st.Stale != s.stale {
				t.Errorf("apply %+v, want added %d updated %d removed %d stale %d", st, s.added, s.updated, s.removed, s.stale)
			}
			for _, c := range []struct {
				m    *ebpf.Map
				want int
			}{
				{dp.lb.SlSvc, s.frontends},
				{dp.lb.SlSvcBackends, s.backends},
				{dp.lb.SlSvcMembers, s.members},
				{dp.lb.SlSvcSelected, s.members},
				{dp.lb.SlSvcRefused, s.refus},
			} {
				if got := entries(t, c.m); got != c.want {
					t.Errorf("map %s holds %d entries, want %d", c.m, got, c.want)
				}
			}
		})
	}
}

// TestApplyKeepsPreviousBank: across changes of one frontend's size, the
// live bank holds the new backends and the other bank the previous ones
// (so a connect that read the frontend before the switch finds its slot);
// slots past the previous set's end never linger.
func TestApplyKeepsPreviousBank(t *testing.T) {
	dp := testDatapath(t)
	set := func(n int) *service.Set {
		s := &service.Service{Name: "grow", VIPs: []netip.Addr{netip.MustParseAddr("198.19.0.1")}, Ports: []service.Port{{Port: 80}}}
		for i := range n {
			s.Backends = append(s.Backends, service.Backend{IP: netip.AddrFrom4([4]byte{198, 18, 1, byte(i + 1)})})
		}
		ss, err := service.NewSet([]*service.Service{s})
		if err != nil {
			t.Fatal(err)
		}
		return ss
	}
	live, prev := 0, 0
	for _, n := range []int{4, 2, 1, 3, 3, 5} {
		if _, err := dp.ApplyServices(set(n)); err != nil {
			t.Fatal(err)
		}
		if n != live { // unchanged: nothing is written
			live, prev = n, live
		}
		if got := entries(t, dp.lb.SlSvcBackends); got != live+prev {
			t.Errorf("after an apply of %d backends (previous bank %d): %d slots, want %d", n, prev, got, live+prev)
		}
	}
}

// lbView is what the service maps mean, whatever ids they use: each
// frontend's live backends in slot order, its counts, flags and members.
type lbView map[servicelbSlSvcKey]string

func viewOf(t *testing.T, dp *Datapath) lbView {
	t.Helper()
	m, err := dp.readMirror()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := readAll[servicelbSlMaglevKey, servicelbSlMaglev](dp.lb.SlSvcMaglev)
	if err != nil {
		t.Fatal(err)
	}
	out := lbView{}
	for k, v := range m.svcs {
		var b strings.Builder
		fmt.Fprintf(&b, "ready %d terminating %d affinity %d flags %d:", v.Ready, v.Terminating, v.AffinityS, v.Flags)
		for i := range int(v.Ready) + int(v.Terminating) {
			be, ok := m.slots[servicelbSlBackendKey{Id: v.Id, Slot: uint32(v.Bank)<<bankShift | uint32(i)}]
			fmt.Fprintf(&b, " %v:%d(%v)", wordsAddr(be.Ip), be.Port, ok)
		}
		mem := m.members[v.Id]
		keys := slices.Collect(maps.Keys(mem))
		slices.SortFunc(keys, func(a, b servicelbSlBackend) int { return wordsAddr(a.Ip).Compare(wordsAddr(b.Ip)) })
		for _, be := range keys {
			fmt.Fprintf(&b, " member %v:%d=%d", wordsAddr(be.Ip), be.Port, mem[be])
		}
		if v.Flags&uint16(servicelbSlSvcFlagSL_SVC_MAGLEV) != 0 && v.Ready > 0 {
			tab, ok := tables[servicelbSlMaglevKey{Id: v.Id, Bank: uint32(v.Bank)}]
			fmt.Fprintf(&b, " maglev %v %x", ok, sha256.Sum256([]byte(fmt.Sprint(tab))))
		}
		out[k] = b.String()
	}
	return out
}

// TestUpdateServices: a datapath given only the changes (the services a
// service.Partitioner says changed, and those it says left) holds what a
// datapath given the whole set each time holds, frontend by frontend,
// across 150 batches of random changes to 300 services that share
// addresses (frontends move between services, clash, are left out and
// come back); its mirror stays the maps' and nothing else is touched. A
// datapath without the record of its last apply refuses an update.
func TestUpdateServices(t *testing.T) {
	inc := testDatapath(t)
	full := testDatapathWith(t, Config{PinDir: filepath.Join("/sys/fs/bpf", fmt.Sprintf("sltest-dp-full-%d", os.Getpid())), Settings: Settings{Bypass: ModeOn, VerdictWindow: DefaultVerdictWindow}})
	if _, err := inc.UpdateServices(nil, []string{"default/x"}); !errors.Is(err, ErrNoServiceMirror) {
		t.Fatalf("an update before any apply: %v, want ErrNoServiceMirror", err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	part := service.NewPartitioner(service.Budget{})
	random := func(i int) *service.Service {
		s := &service.Service{Name: fmt.Sprintf("s%03d", i), VIPs: []netip.Addr{netip.AddrFrom4([4]byte{198, 19, 1, byte(1 + rng.IntN(200))})}}
		for j := range 1 + rng.IntN(2) {
			s.Ports = append(s.Ports, service.Port{Name: fmt.Sprintf("p%d", j), Port: uint16(80 + j + rng.IntN(2))})
		}
		if rng.IntN(4) == 0 {
			s.Selection = service.SelectMaglev
		}
		if rng.IntN(4) == 0 {
			s.Affinity, s.Timeout = service.AffinityClientIP, time.Duration(1+rng.IntN(100))*time.Second
		}
		for j := range rng.IntN(6) {
			ready := rng.IntN(4) != 0
			s.Backends = append(s.Backends, service.Backend{IP: netip.AddrFrom4([4]byte{198, 18, 2, byte(1 + j + rng.IntN(3))}), Ready: &ready})
		}
		return s
	}
	for i := range 300 {
		part.Put(random(i))
	}
	part.Flush()
	set, _ := part.Snapshot()
	if _, err := inc.ApplyServices(set); err != nil {
		t.Fatal(err)
	}
	batches := 150
	if testing.Short() { // the kernel matrix: emulated map writes
		batches = 40
	}
	for batch := range batches {
		for range 1 + rng.IntN(8) {
			i := rng.IntN(300)
			if rng.IntN(5) == 0 {
				part.Delete(fmt.Sprintf("default/s%03d", i))
			} else {
				part.Put(random(i))
			}
		}
		var changed []*service.Service
		var removed []string
		for _, o := range part.Flush() {
			if o.Service != nil {
				changed = append(changed, o.Service)
			} else {
				removed = append(removed, o.Key)
			}
		}
		st, err := inc.UpdateServices(changed, removed)
		if err != nil {
			t.Fatalf("batch %d: %v", batch, err)
		}
		set, _ := part.Snapshot()
		if _, err := full.ApplyServices(set); err != nil {
			t.Fatal(err)
		}
		got, want := viewOf(t, inc), viewOf(t, full)
		if st.Frontends != len(want) {
			t.Errorf("batch %d: the update reports %d frontends, %d are served", batch, st.Frontends, len(want))
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("batch %d (%d changed, %d removed): frontend %v:%d\n updated: %q\n applied: %q", batch, len(changed), len(removed), wordsAddr(k.Ip), k.Port, got[k], v)
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				t.Fatalf("batch %d: frontend %v:%d left behind by the update", batch, wordsAddr(k.Ip), k.Port)
			}
		}
		mirrorMatchesMaps(t, inc, fmt.Sprintf("batch %d", batch))
	}
	inc.ForgetServiceMirror()
	if _, err := inc.UpdateServices(nil, []string{"default/s001"}); !errors.Is(err, ErrNoServiceMirror) {
		t.Fatalf("an update after the mirror was forgotten: %v, want ErrNoServiceMirror", err)
	}
	// One change of many costs its own writes.
	n := 10000
	if testing.Short() {
		n = 1000
	}
	if _, err := inc.ApplyServices(manyServices(t, n, 0)); err != nil {
		t.Fatal(err)
	}
	changed := manyServices(t, n, 1).Services[0]
	for i := range 6 {
		s := changed
		if i%2 == 1 {
			s = manyServices(t, 1, 0).Services[0]
		}
		st, err := inc.UpdateServices([]*service.Service{s}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d services, one changed: updated in %s (%d frontends, %d updated, %d stale)", n, st.Took, st.Frontends, st.Updated, st.Stale)
		if st.Frontends != n || st.Updated != 1 || st.Stale != 1 {
			t.Errorf("update %+v, want %d frontends, one updated with one stale member", st, n)
		}
	}
	mirrorMatchesMaps(t, inc, "after single updates")
}
