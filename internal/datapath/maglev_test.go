package datapath

import (
	"net/netip"
	"testing"
)

func maglevBackends(n int) []servicelbSlBackend {
	out := make([]servicelbSlBackend, n)
	for i := range out {
		out[i] = servicelbSlBackend{Ip: addrWords(netip.AddrFrom4([4]byte{198, 18, 7, byte(i + 1)})), Port: 8080}
	}
	return out
}

// shares counts each backend's entries.
func shares(t *servicelbSlMaglev, n int) []int {
	out := make([]int, n)
	for _, s := range t.Slot {
		out[s]++
	}
	return out
}

// TestMaglevTable: every entry names a backend, shares are even (or by
// weight), and removing a backend moves only its own entries (nearly:
// Maglev's bound), so the clients of the others keep their backend.
func TestMaglevTable(t *testing.T) {
	if maglevTable(nil, nil) != nil {
		t.Fatal("a table for no backends")
	}
	for _, tc := range []struct {
		name    string
		n       int
		weights []uint16
		want    []float64 // shares
	}{
		{"one", 1, nil, []float64{1}},
		{"three", 3, nil, []float64{1. / 3, 1. / 3, 1. / 3}},
		{"weighted 2:1:1", 3, []uint16{2, 1, 1}, []float64{.5, .25, .25}},
		{"ten", 10, nil, []float64{.1, .1, .1, .1, .1, .1, .1, .1, .1, .1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tab := maglevTable(maglevBackends(tc.n), tc.weights)
			for i, got := range shares(tab, tc.n) {
				if share := float64(got) / float64(maglevSize); share < tc.want[i]*0.9 || share > tc.want[i]*1.1 {
					t.Errorf("backend %d has %.3f of the table, want %.3f", i, share, tc.want[i])
				}
			}
		})
	}
	// Remove backend 3 of 10: entries of the others that stay theirs.
	all := maglevBackends(10)
	before := maglevTable(all, nil)
	rest := append(append([]servicelbSlBackend{}, all[:3]...), all[4:]...)
	after := maglevTable(rest, nil)
	moved, kept := 0, 0
	for i := range before.Slot {
		b := before.Slot[i]
		if b == 3 {
			continue
		}
		if all[b] == rest[after.Slot[i]] {
			kept++
		} else {
			moved++
		}
	}
	if frac := float64(moved) / float64(moved+kept); frac > 0.1 {
		t.Errorf("removing one backend of ten moved %.1f%% of the others' entries", 100*frac)
	}
	// The same set gives the same table: a backend re-added restores it.
	if again := maglevTable(all, nil); *again != *before {
		t.Error("the same backends gave another table")
	}
}
