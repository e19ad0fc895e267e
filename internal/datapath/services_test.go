package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

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
