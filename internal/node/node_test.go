package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/socklane/socklane/internal/cgroups"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/testutil"
)

// TestSelection: a selection names exactly one kind of target, and what
// it names must exist; nothing is dialled or attached on the way.
func TestSelection(t *testing.T) {
	if _, err := cgroups.Root(); err != nil {
		t.Skipf("no cgroup v2 mount here: %v", err)
	}
	for _, tt := range []struct {
		name string
		sel  Selection
		want string
	}{
		{"nothing", Selection{}, "give exactly one of"},
		{"two", Selection{Cgroup: "a", PID: 1}, "give exactly one of"},
		{"container without pod", Selection{Cgroup: "a", Container: "c"}, "--container needs --pod"},
		{"negative pid", Selection{PID: -1}, "invalid --pid -1"},
		{"missing cgroup", Selection{Cgroup: "socklane-does-not-exist"}, "give an existing cgroup v2 directory"},
		{"outside the hierarchy", Selection{Cgroup: "../.."}, "is not inside the cgroup v2 hierarchy"},
		{"bad selector", Selection{Selector: "app"}, "app"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.sel.Targets(context.Background())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error saying %q", err, tt.want)
			}
		})
	}
	root, _ := cgroups.Root()
	targets, err := Selection{Cgroup: RootTarget}.Targets(context.Background())
	if err != nil || len(targets) != 1 || targets[0].Path != root || targets[0].ID == 0 {
		t.Errorf("the root as %q: %+v, %v; want %s", RootTarget, targets, err, root)
	}
	self, err := Selection{PID: os.Getpid()}.Targets(context.Background())
	if err != nil || len(self) != 1 || !strings.HasPrefix(self[0].Path, root) {
		t.Errorf("this process's cgroup: %+v, %v", self, err)
	}
}

// TestStartRefusesBadSettings: settings that cannot load are refused
// before the preflight, so also without root.
func TestStartRefusesBadSettings(t *testing.T) {
	s := datapath.DefaultSettings()
	s.VerdictWindow = datapath.MaxVerdictWindow + 1
	_, _, err := Start(Config{BPFFS: t.TempDir(), PinName: "x", Settings: s}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "--verdict-window") {
		t.Errorf("got %v, want the bad setting named", err)
	}
}

// TestDownNothingPinned: down of an instance that is not there says so
// (the CLI turns it into its message), and touches nothing.
func TestDownNothingPinned(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "none")
	_, err := Down(dir, false, 0, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if !errors.Is(err, datapath.ErrNotPinned) {
		t.Errorf("got %v, want ErrNotPinned", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("down created %s", dir)
	}
}

// TestExclusive: the instance's locks are exclusive, and free again once
// released.
func TestExclusive(t *testing.T) {
	testutil.RequireRoot(t) // the state directory is under /run
	name := "sltest-lock-" + strings.ReplaceAll(t.Name(), "/", "-")
	t.Cleanup(func() { os.RemoveAll(StateDir(name)) })
	unlock, err := Exclusive(name, "events")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Exclusive(name, "events"); err == nil {
		t.Error("a second holder got the lock")
	}
	other, err := Exclusive(name, "capture")
	if err != nil {
		t.Errorf("another lock of the instance: %v", err)
	} else {
		other()
	}
	unlock()
	again, err := Exclusive(name, "events")
	if err != nil {
		t.Errorf("after release: %v", err)
	} else {
		again()
	}
}
