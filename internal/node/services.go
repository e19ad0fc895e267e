package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/service"
	"github.com/socklane/socklane/internal/sockdiag"
	"golang.org/x/sys/unix"
)

// StateRoot holds what the datapath's maps cannot: the applied service
// definitions with their names. Like the pins, it lives until reboot.
const StateRoot = "/run/socklane"

// StateDir is one datapath instance's state directory.
func StateDir(name string) string { return filepath.Join(StateRoot, name) }

// privateStateDir makes the instance's state directory, and StateRoot,
// readable by root only (the applied services name every backend), also
// when they exist already with other modes.
func privateStateDir(name string) (string, error) {
	dir := StateDir(name)
	for _, d := range []string{StateRoot, dir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return "", fmt.Errorf("creating %s: %w", d, err)
		}
		if err := os.Chmod(d, 0o700); err != nil {
			return "", fmt.Errorf("restricting %s to root: %w", d, err)
		}
	}
	return dir, nil
}

const servicesFile = "services.json"

// ApplyServices programs the load balancer with an already validated set,
// records it for `svc list`, and destroys the connected sockets of
// backends it removed, so that their clients reconnect to a live one.
// Appliers of one instance (the agent's file watch, `svc apply`) take
// turns through a lock file.
func ApplyServices(dp *datapath.Datapath, name string, set *service.Set, skipped []service.Skipped) (datapath.ApplyStats, error) {
	dir, err := privateStateDir(name)
	if err != nil {
		return datapath.ApplyStats{}, err
	}
	unlock, err := lockFile(filepath.Join(dir, "apply.lock"))
	if err != nil {
		return datapath.ApplyStats{}, err
	}
	defer unlock()
	// The datapath diffs against what it last programmed, unless
	// another applier (another process) has written since: the record
	// it left is then not the one this datapath tagged.
	if tag := recordTag(dir); tag == "" || tag != dp.ServiceMirrorTag() {
		dp.ForgetServiceMirror()
	}
	return applyWhole(dp, dir, set, skipped)
}

// applyWhole applies set and records it (whole: the journal of updates
// goes), under the apply lock.
func applyWhole(dp *datapath.Datapath, dir string, set *service.Set, skipped []service.Skipped) (datapath.ApplyStats, error) {
	st, err := dp.ApplyServices(set)
	if err != nil {
		return st, fmt.Errorf("applying services: %w", err)
	}
	if err := destroyStale(dp, &st); err != nil {
		return st, err
	}
	if err := recordWhole(dir, set, skipped); err != nil {
		dp.ForgetServiceMirror()
		return st, err
	}
	dp.SetServiceMirrorTag(recordTag(dir))
	return st, nil
}

// destroyStale destroys the connected sockets of the backends an apply
// removed, so that their clients reconnect to a live one.
func destroyStale(dp *datapath.Datapath, st *datapath.ApplyStats) error {
	stale, err := dp.StaleSockets(*st)
	if err != nil {
		return err
	}
	if len(stale) > 0 {
		n, err := sockdiag.DestroyAll(diagTargets(stale))
		st.Destroyed = n
		if err != nil {
			return fmt.Errorf("destroying sockets of removed backends: %w", err)
		}
	}
	return nil
}

// recordWhole writes the record of the services applied and skipped
// (the journal first goes: a record never takes an older journal).
func recordWhole(dir string, set *service.Set, skipped []service.Skipped) error {
	if err := os.Remove(filepath.Join(dir, serviceLogFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("recording services: %w", err)
	}
	if err := writeJSONFile(filepath.Join(dir, servicesFile), set.Services); err != nil {
		return fmt.Errorf("recording services: %w", err)
	}
	if skipped == nil {
		skipped = []service.Skipped{}
	}
	if err := writeJSONFile(filepath.Join(dir, skippedFile), skipped); err != nil {
		return fmt.Errorf("recording skipped services: %w", err)
	}
	return nil
}

const skippedFile = "skipped.json"

// fileTag names one version of a file: each write replaces it by a new
// file (rename), so its inode and change time differ ("" if absent).
func fileTag(path string) string {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return ""
	}
	return fmt.Sprintf("%d:%d:%d.%d", st.Dev, st.Ino, st.Ctim.Sec, st.Ctim.Nsec)
}

// writeJSONFile replaces path with v, readable by root only.
func writeJSONFile(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// SkippedServices reads the services the last apply left out.
func SkippedServices(name string) ([]service.Skipped, error) {
	_, skipped, err := readRecord(StateDir(name))
	return skipped, err
}

// AppliedServices returns the set last applied to instance name (empty if
// none).
func AppliedServices(name string) ([]*service.Service, error) {
	svcs, _, err := readRecord(StateDir(name))
	return svcs, err
}

// lockFile takes an exclusive lock on path, waiting for other holders.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// Exclusive takes the instance's lock named what without waiting: the
// event stream and the capture each have one reader at a time.
func Exclusive(name, what string) (func(), error) {
	dir, err := privateStateDir(name)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, what+".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("another `socklane %s` is running on this datapath (one reader at a time): stop it first", what)
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// FrontendNames maps the applied services' frontends to their names.
func FrontendNames(name string) (map[string]string, error) {
	svcs, err := AppliedServices(name)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, s := range svcs {
		for _, f := range s.Frontends() {
			out[f.String()] = s.Key()
		}
	}
	return out, nil
}
