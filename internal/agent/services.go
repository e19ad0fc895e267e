package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/socklane/socklane/internal/cgroups"
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
	st, err := dp.ApplyServices(set)
	if err != nil {
		return st, fmt.Errorf("applying services: %w", err)
	}
	stale, err := dp.StaleSockets(st)
	if err != nil {
		return st, err
	}
	if len(stale) > 0 {
		n, err := sockdiag.DestroyAll(diagTargets(stale))
		st.Destroyed = n
		if err != nil {
			return st, fmt.Errorf("destroying sockets of removed backends: %w", err)
		}
	}
	if err := writeJSONFile(filepath.Join(dir, servicesFile), set.Services); err != nil {
		return st, fmt.Errorf("recording services: %w", err)
	}
	if skipped == nil {
		skipped = []service.Skipped{}
	}
	if err := writeJSONFile(filepath.Join(dir, skippedFile), skipped); err != nil {
		return st, fmt.Errorf("recording skipped services: %w", err)
	}
	return st, nil
}

const skippedFile = "skipped.json"

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
	b, err := os.ReadFile(filepath.Join(StateDir(name), skippedFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading skipped services: %w", err)
	}
	var out []service.Skipped
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("reading skipped services: %w", err)
	}
	return out, nil
}

// PruneTrackedSockets forgets the load balancer's entries for connected
// sockets their owners closed while the socket's cgroup was detached, so
// that no program saw them go, and returns how many it forgot. Entries
// made while it runs are not looked at; a socket that closes meanwhile
// removes its own entry.
func PruneTrackedSockets(dp *datapath.Datapath) (int, error) {
	tracked, err := dp.Tracked()
	if err != nil || len(tracked) == 0 {
		return 0, err
	}
	open, err := sockdiag.Owned(diagTargets(tracked))
	if err != nil {
		return 0, fmt.Errorf("finding translated sockets: %w", err)
	}
	var gone []uint64
	for _, s := range tracked {
		if !open[s.Cookie] {
			gone = append(gone, s.Cookie)
		}
	}
	return dp.ForgetTracked(gone)
}

// SweepSlots frees the bypass's connection slots whose member sockets all
// closed unseen (their cgroup was detached meanwhile).
func SweepSlots(dp *datapath.Datapath) (datapath.SweepStats, error) {
	return dp.Sweep(func(socks []datapath.MemberSocket) (map[uint64]bool, error) {
		targets := make([]sockdiag.Target, len(socks))
		for i, s := range socks {
			targets[i] = sockdiag.Target{Cookie: s.Cookie, Netns: s.Netns, Protocol: unix.IPPROTO_TCP}
		}
		return sockdiag.Owned(targets)
	})
}

// Reclaim returns what sockets that closed while their cgroup was
// detached left behind: the load balancer's entries and the bypass's
// connection slots. Errors are logged: the next round tries again.
func Reclaim(dp *datapath.Datapath, log *slog.Logger) {
	if n, err := PruneTrackedSockets(dp); err != nil {
		log.Warn("pruning the load balancer's socket table", "err", err)
	} else if n > 0 {
		log.Info("load balancer forgot closed sockets", "sockets", n)
	}
	if st, err := SweepSlots(dp); err != nil {
		log.Warn("sweeping connection slots", "err", err)
	} else if st.Reclaimed > 0 {
		log.Info("connection slots reclaimed", "reclaimed", st.Reclaimed, "in_use", st.InUse-st.Reclaimed)
	}
	if n, err := forgetGoneOwners(dp); err != nil {
		log.Warn("forgetting the quotas of removed cgroups", "err", err)
	} else if n > 0 {
		log.Info("quotas of removed cgroups forgotten", "owners", n)
	}
}

// forgetGoneOwners removes the quota entries, and the listener entries, of
// cgroups that no longer exist.
func forgetGoneOwners(dp *datapath.Datapath) (int, error) {
	root, err := cgroups.Root()
	if err != nil {
		return 0, err
	}
	owners, err := dp.Owners()
	if err != nil {
		return 0, err
	}
	gone := map[uint64]bool{}
	for _, o := range owners {
		if _, err := cgroups.PathOf(root, o.Cgroup); errors.Is(err, cgroups.ErrGone) {
			gone[o.Cgroup] = true
		}
	}
	// Their listeners' close went unseen too.
	if _, err := dp.ForgetListenersOf(gone); err != nil {
		return 0, err
	}
	n := 0
	for id := range gone {
		if err := dp.ForgetOwner(id); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// diagTargets names tracked sockets for sock_diag.
func diagTargets(socks []datapath.TrackedSocket) []sockdiag.Target {
	out := make([]sockdiag.Target, len(socks))
	for i, s := range socks {
		out[i] = sockdiag.Target{Cookie: s.Cookie, Netns: s.Netns, Protocol: s.Protocol.Number()}
	}
	return out
}

// AppliedServices returns the set last applied to instance name (empty if
// none).
func AppliedServices(name string) ([]*service.Service, error) {
	b, err := os.ReadFile(filepath.Join(StateDir(name), servicesFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading applied services: %w", err)
	}
	var out []*service.Service
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("reading applied services: %w", err)
	}
	return out, nil
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
