package agent

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/ports"
)

// DefaultServicesInterval is how often the agent rereads its service and
// policy files.
const DefaultServicesInterval = time.Second

// fileWatch applies a file (services, policies) whenever its content
// changes. Content, not modification time, decides: editors that replace
// the file, and Kubernetes ConfigMap volumes that swap a symlink, are
// both seen.
type fileWatch[S any] struct {
	what    string // "service", "policy"
	path    string
	parse   func([]byte) (S, error)
	apply   func(S) error
	log     *slog.Logger
	applied [sha256.Size]byte // content last applied
	refused [sha256.Size]byte // content last refused (logged once)
}

// load reads and validates the file, returning its digest.
func (w *fileWatch[S]) load() (S, [sha256.Size]byte, error) {
	var zero S
	b, err := os.ReadFile(w.path)
	if err != nil {
		return zero, [sha256.Size]byte{}, fmt.Errorf("reading %s file: %w", w.what, err)
	}
	sum := sha256.Sum256(b)
	set, err := w.parse(b)
	if err != nil {
		return zero, sum, fmt.Errorf("%s: %w", w.path, err)
	}
	return set, sum, nil
}

// applyNow programs a loaded set and remembers its content.
func (w *fileWatch[S]) applyNow(set S, sum [sha256.Size]byte) error {
	if err := w.apply(set); err != nil {
		return err
	}
	w.applied = sum
	return nil
}

// poll applies the file if its content changed. A file that cannot be read
// or fails validation is logged and what was applied stays as it is.
func (w *fileWatch[S]) poll() {
	set, sum, err := w.load()
	if sum == w.applied && err == nil {
		return
	}
	if err != nil {
		if sum != w.refused {
			w.refused = sum
			w.log.Error(w.what+" file refused; what was applied stays as it is", "err", err)
		}
		return
	}
	if err := w.applyNow(set, sum); err != nil {
		w.log.Error("applying "+w.what+" file", "file", w.path, "err", err)
	}
}

// portsFollow applies the ports file again when the cgroups its workloads
// resolve to changed (a pod restarted, a process moved): the rules follow
// the workloads, not the cgroups they had when applied.
func portsFollow(ctx context.Context, w *fileWatch[*ports.Set], cfg Config, log *slog.Logger) {
	set, sum, err := w.load()
	if err != nil || sum != w.applied {
		return // refused, or not applied yet: poll logs it
	}
	changed, err := node.PortCgroupsChanged(ctx, cfg.PinName, set, cfg.CRISocket)
	if err != nil {
		log.Debug("resolving port workloads", "err", err)
		return
	}
	if changed {
		if err := w.applyNow(set, sum); err != nil {
			log.Error("applying ports file again", "file", w.path, "err", err)
		}
	}
}
