// Package node holds socklane's one-shot operations on a node: the
// preflight every command that loads the datapath runs (root, cgroup v2,
// kernel, bpffs), finding the cgroups to attach, starting or adopting the
// datapath with the settings asked for, applying services, reclaiming
// what closed sockets left behind, the instance's locks and state, and
// removing it all. The agent (package agent) is the long-running daemon
// built on them; the CLI calls them directly.
package node

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/socklane/socklane/internal/bpffs"
	"github.com/socklane/socklane/internal/cgroups"
	"github.com/socklane/socklane/internal/datapath"
)

// Config names one socklane instance on the node and what a new load of
// its datapath asks for.
type Config struct {
	BPFFS   string
	PinName string
	// Settings a new datapath loads with (datapath.DefaultSettings
	// unless the flags say otherwise).
	Settings datapath.Settings
	// SettingsGiven names (by flag) the settings the user gave. A running
	// datapath keeps the settings it was loaded with, so Start refuses
	// given ones it does not have.
	SettingsGiven []string
}

// PinDir is where the instance's datapath is pinned.
func (c Config) PinDir() string { return filepath.Join(c.BPFFS, c.PinName) }

// RequireRoot fails unless the process is root.
func RequireRoot() error {
	if os.Geteuid() != 0 {
		return errors.New("socklane must run as root (it loads BPF programs and attaches them to cgroups): run it with sudo")
	}
	return nil
}

// Target is a cgroup to attach to, resolved and checked.
type Target struct {
	Path string `json:"cgroup"`
	ID   uint64 `json:"cgroup_id"`
}

// ResolveTargets checks every cgroup (absolute, or relative to the cgroup
// v2 root) before anything is attached.
func ResolveTargets(paths []string) ([]Target, error) {
	root, err := cgroups.Root()
	if err != nil {
		return nil, err
	}
	var out []Target
	for _, p := range paths {
		path, id, err := cgroups.Resolve(root, p)
		if err != nil {
			return nil, err
		}
		out = append(out, Target{Path: path, ID: id})
	}
	return out, nil
}

// RootTarget is the cgroup v2 root, for paths: what an agent without
// cgroups or pod selectors attaches to.
const RootTarget = "."

// Preflight runs what every command that loads the datapath checks
// first, before it changes anything: root, the cgroups given (none is
// fine; a cgroup v2 mount is required all the same), every kernel feature
// the datapath's programs use (naming all that are missing), and a bpf
// filesystem at bpffsDir (mounted if absent).
func Preflight(bpffsDir string, cgroupPaths []string) ([]Target, error) {
	if err := RequireRoot(); err != nil {
		return nil, err
	}
	targets, err := ResolveTargets(cgroupPaths)
	if err != nil {
		return nil, err
	}
	if err := datapath.CheckKernel(); err != nil {
		return nil, err
	}
	if err := bpffs.Ensure(bpffsDir); err != nil {
		return nil, err
	}
	return targets, nil
}

// Start prepares the node for cfg: preflight, datapath (loaded, or
// adopted if its settings are those given), attachments to the cgroups
// given. It returns the open datapath; the pinned state outlives the
// process.
func Start(cfg Config, cgroupPaths []string, log *slog.Logger) (*datapath.Datapath, []Target, error) {
	if err := cfg.Settings.Validate(); err != nil {
		return nil, nil, err
	}
	targets, err := Preflight(cfg.BPFFS, cgroupPaths)
	if err != nil {
		return nil, nil, err
	}
	dp, err := datapath.Open(datapath.Config{PinDir: cfg.PinDir(), Settings: cfg.Settings})
	if err != nil {
		return nil, nil, err
	}
	if err := checkAdopted(dp, cfg.Settings.Resolve(dp.Features()), cfg.SettingsGiven); err != nil {
		dp.Close()
		return nil, nil, err
	}
	log.Info("datapath ready", "pin_dir", dp.PinDir(), "adopted", dp.Adopted())
	if st, err := dp.Settings(); err == nil {
		for _, d := range dp.Features().Decided(st) {
			log.Warn("kernel bug decides a setting", "decided", d)
		}
	}
	for _, t := range targets {
		a, err := dp.Attach(t.Path, t.ID)
		if err != nil {
			dp.Close()
			return nil, nil, err
		}
		log.Info("bypass attached", "cgroup", t.Path, "cgroup_id", t.ID, "link_id", a.LinkID)
	}
	// Sockets that closed while nothing was attached left their entries.
	Reclaim(dp, log)
	return dp, targets, nil
}

// OpenRunning opens the instance's running datapath for reading or
// changing; it never creates one.
func OpenRunning(bpffsDir, pinName string) (*datapath.Datapath, error) {
	if err := RequireRoot(); err != nil {
		return nil, err
	}
	if err := bpffs.Require(bpffsDir); err != nil {
		return nil, err
	}
	dir := filepath.Join(bpffsDir, pinName)
	if !datapath.Pinned(dir) {
		return nil, fmt.Errorf("%w at %s", datapath.ErrNotPinned, dir)
	}
	return datapath.Open(datapath.Config{PinDir: dir})
}

// Down removes socklane from the node. Without force it first detaches
// (no new connection joins the bypass) and waits up to drain for bypassed
// sockets to close, because unpinning the socket map while a socket still
// has redirected bytes queued would drop them. It returns the number of
// sockets still in the map when it gave up (then nothing is unpinned).
func Down(dir string, force bool, drain time.Duration, log *slog.Logger) (int, error) {
	if !datapath.Pinned(dir) {
		if _, err := os.Stat(dir); err == nil {
			// Partial state from an interrupted start.
			return 0, datapath.Pins(dir).Remove()
		}
		return 0, fmt.Errorf("%w at %s", datapath.ErrNotPinned, dir)
	}
	// Through the pins only: a datapath pinned by another version is
	// removable too.
	dp := datapath.Pins(dir)
	n, err := dp.DetachAll()
	if err != nil {
		return 0, err
	}
	log.Info("detached", "attachments", n)
	deadline := time.Now().Add(drain)
	for !force {
		live, err := dp.Sockets()
		if err != nil {
			return 0, err
		}
		if live == 0 {
			break
		}
		if time.Now().After(deadline) {
			return live, nil
		}
		log.Info("draining", "bypassed_sockets", live)
		time.Sleep(200 * time.Millisecond)
	}
	if err := os.RemoveAll(StateDir(filepath.Base(dir))); err != nil {
		return 0, fmt.Errorf("removing service state: %w", err)
	}
	return 0, dp.Remove()
}
