package testbed_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/socklane/socklane/internal/testbed"
	"github.com/socklane/socklane/internal/testutil"
)

// TestForwardRule checks that a bed leaves exactly one FORWARD rule for its
// bridge while it lives, whatever killed beds of the same name left, and
// none once closed.
func TestForwardRule(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireCommand(t, "iptables")
	const bridge = "sltestfwd0" // no bed is ever named so: beds are slbrN
	rule := []string{"FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"}
	count := func() int {
		out, err := exec.Command("iptables", "-w", "-S", "FORWARD").Output()
		if err != nil {
			t.Fatalf("listing FORWARD: %v", err)
		}
		return strings.Count(string(out), "-A FORWARD -i "+bridge+" -o "+bridge+" -j ACCEPT")
	}
	t.Cleanup(func() {
		for range 10 {
			if exec.Command("iptables", append([]string{"-w", "-D"}, rule...)...).Run() != nil {
				return
			}
		}
	})
	for _, tc := range []struct {
		name   string
		leaked int
	}{
		{"clean", 0},
		{"two left by killed beds", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range tc.leaked {
				if out, err := exec.Command("iptables", append([]string{"-w", "-I"}, rule...)...).CombinedOutput(); err != nil {
					t.Fatalf("seeding a stale rule: %v: %s", err, out)
				}
			}
			b, err := testbed.ForwardRuleFor(bridge)
			if err != nil {
				t.Fatal(err)
			}
			if n := count(); n != 1 {
				t.Errorf("%d FORWARD rules for %s while the bed lives, want 1", n, bridge)
			}
			if err := b.Close(); err != nil {
				t.Errorf("closing: %v", err)
			}
			if n := count(); n != 0 {
				t.Errorf("%d FORWARD rules for %s after Close, want 0", n, bridge)
			}
		})
	}
}
