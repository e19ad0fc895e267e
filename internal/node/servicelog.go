package node

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/service"
)

// The record of the applied services is the last whole set
// (services.json, skipped.json) and a journal of the updates since
// (services.log, a JSON line per service whose outcome changed): an
// update appends its own lines, and the journal is folded into a new
// whole record once it outgrows it, so that a change costs its own size
// (amortised).
const serviceLogFile = "services.log"

// journalFloor: below this size the journal is never folded.
const journalFloor = 256 << 10

// logEntry is one service's outcome: served, skipped, or gone (neither).
type logEntry struct {
	Key     string           `json:"key"`
	Service *service.Service `json:"service,omitempty"`
	Skipped *service.Skipped `json:"skipped,omitempty"`
}

// recordTag names one version of the record ("" if there is none).
func recordTag(dir string) string {
	base := fileTag(filepath.Join(dir, servicesFile))
	if base == "" {
		return ""
	}
	return base + "+" + fileTag(filepath.Join(dir, serviceLogFile))
}

// UpdateServices programs the outcomes that changed since this datapath's
// last apply or update (service.Partitioner's Flush) and records them,
// at the cost of the change. Where the change alone cannot be applied (no
// apply by this datapath before, another applier since, an apply that
// failed) it applies the whole set whole returns instead; full says so.
func UpdateServices(dp *datapath.Datapath, name string, changes []service.Outcome, whole func() (*service.Set, []service.Skipped)) (st datapath.ApplyStats, full bool, err error) {
	dir, err := privateStateDir(name)
	if err != nil {
		return st, false, err
	}
	unlock, err := lockFile(filepath.Join(dir, "apply.lock"))
	if err != nil {
		return st, false, err
	}
	defer unlock()
	if tag := recordTag(dir); tag == "" || tag != dp.ServiceMirrorTag() {
		dp.ForgetServiceMirror()
	}
	var changed []*service.Service
	var removed []string
	for _, o := range changes {
		if o.Service != nil {
			changed = append(changed, o.Service)
		} else {
			removed = append(removed, o.Key)
		}
	}
	st, err = dp.UpdateServices(changed, removed)
	if errors.Is(err, datapath.ErrNoServiceMirror) {
		set, skipped := whole()
		st, err = applyWhole(dp, dir, set, skipped)
		return st, true, err
	}
	if err != nil {
		return st, false, fmt.Errorf("applying services: %w", err)
	}
	if err := destroyStale(dp, &st); err != nil {
		return st, false, err
	}
	if err := journal(dir, changes, whole); err != nil {
		dp.ForgetServiceMirror()
		return st, false, err
	}
	dp.SetServiceMirrorTag(recordTag(dir))
	return st, false, nil
}

// journal appends changes to the record, or folds the record anew when
// the journal has outgrown the whole.
func journal(dir string, changes []service.Outcome, whole func() (*service.Set, []service.Skipped)) error {
	var b bytes.Buffer
	for _, o := range changes {
		line, err := json.Marshal(logEntry{Key: o.Key, Service: o.Service, Skipped: o.Skipped})
		if err != nil {
			return fmt.Errorf("recording services: %w", err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	path := filepath.Join(dir, serviceLogFile)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("recording services: %w", err)
	}
	// One write: a reader sees whole lines, or a last one it leaves.
	_, err = f.Write(b.Bytes())
	fi, serr := f.Stat()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("recording services: %w", err)
	}
	var baseSize int64
	for _, n := range []string{servicesFile, skippedFile} {
		if bi, err := os.Stat(filepath.Join(dir, n)); err == nil {
			baseSize += bi.Size()
		}
	}
	if fi.Size() > journalFloor && fi.Size() > baseSize {
		set, skipped := whole()
		return recordWhole(dir, set, skipped)
	}
	return nil
}

// readRecord reads the whole record and replays its journal: the
// services applied and those skipped, by key. A last line cut short (a
// write the writer did not finish) is left out.
func readRecord(dir string) ([]*service.Service, []service.Skipped, error) {
	b, err := os.ReadFile(filepath.Join(dir, servicesFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading applied services: %w", err)
	}
	var svcs []*service.Service
	if err := json.Unmarshal(b, &svcs); err != nil {
		return nil, nil, fmt.Errorf("reading applied services: %w", err)
	}
	var skipped []service.Skipped
	b, err = os.ReadFile(filepath.Join(dir, skippedFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("reading skipped services: %w", err)
	}
	if err == nil {
		if err := json.Unmarshal(b, &skipped); err != nil {
			return nil, nil, fmt.Errorf("reading skipped services: %w", err)
		}
	}
	b, err = os.ReadFile(filepath.Join(dir, serviceLogFile))
	if errors.Is(err, os.ErrNotExist) {
		return svcs, skipped, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading the services' journal: %w", err)
	}
	state := map[string]logEntry{}
	for _, s := range svcs {
		state[s.Key()] = logEntry{Key: s.Key(), Service: s}
	}
	for i := range skipped {
		state[skipped[i].Service] = logEntry{Key: skipped[i].Service, Skipped: &skipped[i]}
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, len(b)+1)
	complete := bytes.HasSuffix(b, []byte("\n"))
	for line := 1; sc.Scan(); line++ {
		var e logEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			if !complete && line == bytes.Count(b, []byte("\n"))+1 {
				break // cut short
			}
			return nil, nil, fmt.Errorf("reading the services' journal, line %d: %w", line, err)
		}
		if e.Service == nil && e.Skipped == nil {
			delete(state, e.Key)
		} else {
			state[e.Key] = e
		}
	}
	svcs, skipped = nil, nil
	for _, e := range state {
		if e.Service != nil {
			svcs = append(svcs, e.Service)
		} else {
			skipped = append(skipped, *e.Skipped)
		}
	}
	slices.SortFunc(svcs, func(a, b *service.Service) int { return cmp.Compare(a.Key(), b.Key()) })
	slices.SortFunc(skipped, func(a, b service.Skipped) int { return cmp.Compare(a.Service, b.Service) })
	return svcs, skipped, nil
}
