package datapath

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/socklane/socklane/internal/bpffs"
	"github.com/socklane/socklane/internal/testutil"
)

// TestFailedLoadLeavesNothing: a creation that fails leaves the bpffs as
// it found it. The loader pins each map as it creates it, so a refusal
// part way (here a pinned map of one of socklane's names that the spec
// cannot use, as a crashed older socklane may leave; a verifier refusal is
// the same) left the maps created before it pinned; and a load refused
// before anything was pinned (settings out of range) left the directory
// Open had made.
func TestFailedLoadLeavesNothing(t *testing.T) {
	t.Run("refused part way", func(t *testing.T) {
		dir := testPinDir(t, "fail")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		// sl_stats is read by most programs: others are created first.
		odd, err := ebpf.NewMap(&ebpf.MapSpec{Name: "sl_stats", Type: ebpf.Hash, KeySize: 8, ValueSize: 8, MaxEntries: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer odd.Close()
		if err := odd.Pin(filepath.Join(dir, "sl_stats")); err != nil {
			t.Fatal(err)
		}
		if dp, err := Open(Config{PinDir: dir, Settings: Settings{Bypass: ModeOn, VerdictWindow: DefaultVerdictWindow}}); err == nil {
			dp.Close()
			t.Fatal("Open adopted an incompatible sl_stats")
		} else {
			t.Logf("refused, as it should be: %v", err)
		}
		left, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range left {
			names = append(names, e.Name())
		}
		if !slices.Equal(names, []string{"sl_stats"}) {
			t.Errorf("a failed load left %v in %s, want only the sl_stats that was there", names, dir)
		}
	})
	t.Run("refused before pinning", func(t *testing.T) {
		dir := testPinDir(t, "fail2")
		if dp, err := Open(Config{PinDir: dir, Settings: Settings{Bypass: ModeOn, VerdictWindow: MaxVerdictWindow + 1}}); err == nil {
			dp.Close()
			t.Fatal("Open took a verdict window past its maximum")
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("a refused load left %s: %v", dir, err)
		}
	})
}

// testPinDir is a pin directory of the bpffs for a test that needs root
// (not made; removed with what is in it at the test's end).
func testPinDir(t *testing.T, name string) string {
	t.Helper()
	testutil.RequireRoot(t)
	if err := bpffs.Ensure("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("sltest-%s-%d", name, os.Getpid()))
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}
