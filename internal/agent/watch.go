package agent

import (
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/service"
)

// DefaultServicesInterval is how often the agent rereads its service file.
const DefaultServicesInterval = time.Second

// serviceWatch applies a service file whenever its content changes.
// Content, not modification time, decides: editors that replace the file,
// and Kubernetes ConfigMap volumes that swap a symlink, are both seen.
type serviceWatch struct {
	dp      *datapath.Datapath
	name    string
	path    string
	log     *slog.Logger
	applied [sha256.Size]byte // content last applied
	refused [sha256.Size]byte // content last refused (logged once)
}

// loadServiceFile reads and validates the file, returning its digest.
func loadServiceFile(path string) (*service.Set, [sha256.Size]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, [sha256.Size]byte{}, fmt.Errorf("reading service file: %w", err)
	}
	sum := sha256.Sum256(b)
	set, err := service.Parse(b)
	if err != nil {
		return nil, sum, fmt.Errorf("%s: %w", path, err)
	}
	return set, sum, nil
}

// apply programs set and logs what changed.
func (w *serviceWatch) apply(set *service.Set, sum [sha256.Size]byte) error {
	st, err := node.ApplyServices(w.dp, w.name, set, nil)
	if err != nil {
		return err
	}
	w.applied = sum
	w.log.Info("services applied", "file", w.path, "services", len(set.Services), "frontends", st.Frontends,
		"added", st.Added, "updated", st.Updated, "removed", st.Removed,
		"stale_backends", st.Stale, "sockets_destroyed", st.Destroyed, "took", st.Took)
	return nil
}

// poll applies the file if its content changed. A file that cannot be read
// or fails validation is logged and the applied services stay as they are.
func (w *serviceWatch) poll() {
	set, sum, err := loadServiceFile(w.path)
	if sum == w.applied && err == nil {
		return
	}
	if err != nil {
		if sum != w.refused {
			w.refused = sum
			w.log.Error("service file refused; the applied services stay as they are", "err", err)
		}
		return
	}
	if err := w.apply(set, sum); err != nil {
		w.log.Error("applying service file", "file", w.path, "err", err)
	}
}
