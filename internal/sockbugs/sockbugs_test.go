package sockbugs

import (
	"testing"

	"github.com/socklane/socklane/internal/testutil"
)

// TestDetect runs every probe on this kernel: each reports what it saw.
// On this machine's 6.18 FIONREAD and MSG_PEEK are fixed and splice is not.
func TestDetect(t *testing.T) {
	testutil.RequireRoot(t)
	r, err := Detect()
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Bugs) != len(Names()) {
		t.Fatalf("%d bugs probed, want %d", len(r.Bugs), len(Names()))
	}
	for _, b := range r.Bugs {
		t.Logf("%s: present %v (%s)", b.Name, b.Present, b.Seen)
		if b.Seen == "" || b.Effect == "" || b.Fix == "" {
			t.Errorf("%s: incomplete report %+v", b.Name, b)
		}
	}
	if !r.Has(Splice) {
		t.Errorf("splice sees redirected bytes here: no kernel has that fix; the probe is wrong")
	}
}

// TestProbesOnPlainTCP is the probes' negative control: over plain TCP,
// which has none of these bugs, each must find nothing.
func TestProbesOnPlainTCP(t *testing.T) {
	testutil.RequireRoot(t)
	r, err := detectIn(false)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Bugs) != len(Names()) {
		t.Fatalf("%d probes ran, want %d", len(r.Bugs), len(Names()))
	}
	for _, b := range r.Bugs {
		if b.Present {
			t.Errorf("%s found on plain TCP (%s): the probe is wrong", b.Name, b.Seen)
		}
	}
}
