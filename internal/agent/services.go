package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/service"
)

// StateRoot holds what the datapath's maps cannot: the applied service
// definitions with their names. Like the pins, it lives until reboot.
const StateRoot = "/run/socklane"

// StateDir is one datapath instance's state directory.
func StateDir(name string) string { return filepath.Join(StateRoot, name) }

const servicesFile = "services.json"

// ApplyServices programs the load balancer with an already validated set
// and records it for `svc list`.
func ApplyServices(dp *datapath.Datapath, name string, set *service.Set) (datapath.ApplyStats, error) {
	st, err := dp.ApplyServices(set)
	if err != nil {
		return st, fmt.Errorf("applying services: %w", err)
	}
	dir := StateDir(name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return st, fmt.Errorf("creating %s: %w", dir, err)
	}
	b, err := json.Marshal(set.Services)
	if err != nil {
		return st, err
	}
	tmp := filepath.Join(dir, servicesFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return st, fmt.Errorf("recording services: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, servicesFile)); err != nil {
		return st, fmt.Errorf("recording services: %w", err)
	}
	return st, nil
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
