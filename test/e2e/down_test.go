package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/testutil"
	"golang.org/x/sys/unix"
)

// TestDownRemovesOnlyOwnPins runs on a scratch bpf filesystem holding
// another program's pins, next to socklane's instance and inside its
// directory: `down` removes socklane's pins only, says what it left, and
// an instance that does not exist is reported as such.
func TestDownRemovesOnlyOwnPins(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Binary(t)
	fs := t.TempDir()
	if err := unix.Mount("bpf", fs, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mounting a scratch bpffs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(fs, unix.MNT_DETACH) })
	pin := func(path string) {
		t.Helper()
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := m.Pin(path); err != nil {
			t.Fatal(err)
		}
	}
	other := filepath.Join(fs, "other", "their_map")
	pin(other)
	b := testutil.Bed(t)
	pod := testutil.Pod(t, b, "p")
	run := func(args ...string) (string, error) {
		out, err := exec.Command(bin, append([]string{"--bpffs", fs}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := run("--name", "", "down", "--force"); err == nil || !strings.Contains(out, "an instance name is") {
		t.Fatalf("down with an empty name: %v: %s", err, out)
	}
	if out, err := run("--name", "sldown", "attach", "--cgroup", pod.Cgroup); err != nil {
		t.Fatalf("attach: %v: %s", err, out)
	}
	t.Cleanup(func() { _, _ = run("--name", "sldown", "down", "--force", "--ignore-not-found") })
	if st, err := os.Stat(filepath.Join(fs, "sldown")); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("pin directory: %v, mode %v; want 0700", err, st.Mode().Perm())
	}
	inside := filepath.Join(fs, "sldown", "their_map")
	pin(inside)
	out, err := run("--name", "sldown", "down", "--force")
	if err == nil || !strings.Contains(out, "their_map") || !strings.Contains(out, "did not pin") {
		t.Fatalf("down with a foreign pin in the instance: want an error naming it, got %v: %s", err, out)
	}
	for _, p := range []string{other, inside} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("another program's pin %s was removed: %v", p, err)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(fs, "sldown"))
	if len(entries) != 1 {
		t.Errorf("left in the instance directory: %d entries, want only their_map", len(entries))
	}
	if err := os.Remove(inside); err != nil {
		t.Fatal(err)
	}
	// The instance is gone (its pins are): down says so, and removes the
	// empty directory only with nothing of socklane's left.
	out, err = run("--name", "sldown", "down")
	if err != nil {
		t.Fatalf("down of an emptied instance directory: %v: %s", err, out)
	}
	out, err = run("--name", "sldown", "down")
	if err == nil || !strings.Contains(out, `no socklane instance "sldown"`) {
		t.Fatalf("down of a removed instance: want an error saying so, got %v: %s", err, out)
	}
	if out, err := run("--name", "sldown", "down", "--ignore-not-found"); err != nil {
		t.Fatalf("down --ignore-not-found: %v: %s", err, out)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("another program's pin %s was removed: %v", other, err)
	}
}

// TestAdoptRefusesOtherLayout: pins recorded with another layout version,
// or none (an older socklane), are not adopted: the error names the fix
// (`socklane down`, which drains), and the running datapath is untouched.
func TestAdoptRefusesOtherLayout(t *testing.T) {
	b := testutil.Bed(t)
	in := testutil.NewInstance(t)
	p1, p2 := testutil.Pod(t, b, "one"), testutil.Pod(t, b, "two")
	in.Attach(p1)
	pin := filepath.Join("/sys/fs/bpf", in.Name, "sl_layout")
	m, err := ebpf.LoadPinnedMap(pin, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var v uint32
	if err := m.Lookup(uint32(0), &v); err != nil || v != datapath.LayoutVersion {
		t.Fatalf("recorded layout: %d, %v; want %d", v, err, datapath.LayoutVersion)
	}
	// The attachments are the link pins.
	attachments := func() string {
		entries, err := os.ReadDir(filepath.Dir(pin))
		if err != nil {
			t.Fatal(err)
		}
		var links []string
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "link_") {
				links = append(links, e.Name())
			}
		}
		return strings.Join(links, " ")
	}
	before := attachments()
	for _, tt := range []struct {
		name, want string
		change     func() error
	}{
		{"another version", "has layout 99", func() error { return m.Update(uint32(0), uint32(99), ebpf.UpdateAny) }},
		{"no version", "older socklane", func() error { return os.Remove(pin) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.change(); err != nil {
				t.Fatal(err)
			}
			out, err := in.Run("attach", "--cgroup", p2.Cgroup)
			if err == nil || !strings.Contains(out, tt.want) || !strings.Contains(out, "socklane down") {
				t.Fatalf("attach over pins of another layout: want an error saying %q and naming `socklane down`, got %v: %s", tt.want, err, out)
			}
			if got := attachments(); got != before {
				t.Fatalf("attachments changed by a refused adoption:\n%s\nwant\n%s", got, before)
			}
		})
	}
	// down works through the pins alone.
	in.MustRun("down", "--force")
	if _, err := os.Stat(filepath.Join("/sys/fs/bpf", in.Name)); err == nil {
		t.Fatal("pin directory left after down")
	}
}
