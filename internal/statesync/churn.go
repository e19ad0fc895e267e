package statesync

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// Churn is a BPF writer of a synced map (sl_churn, a hash of u64 keys to
// struct sl_churn_val), the way an eBPF load balancer writes its
// connection table: the tests' and the bench's stand-in for a program
// socklane does not own. It pins its map and its change-record ring
// buffer in one directory.
type Churn struct {
	objs churnObjects
	Dir  string
}

// ChurnVal is what a churn write stores.
type ChurnVal = churnSlChurnVal

// ChurnMapName is the churn map's pin in Dir.
func ChurnMapName() string {
	spec, err := loadChurn()
	if err != nil {
		return ""
	}
	var m churnMapSpecs
	if err := spec.Assign(&m); err != nil {
		return ""
	}
	return m.SlChurn.Name
}

// recordPins are the pins, in a changes= directory, of the change
// records, their loss counter and the CPUs' stages.
type recordPins struct {
	ring, lost, stages string
}

func changePins(dir string) (recordPins, error) {
	spec, err := loadChurn()
	if err != nil {
		return recordPins{}, err
	}
	var m churnMapSpecs
	if err := spec.Assign(&m); err != nil {
		return recordPins{}, err
	}
	return recordPins{
		ring:   filepath.Join(dir, m.SlSyncChanges.Name),
		lost:   filepath.Join(dir, m.SlSyncLost.Name),
		stages: filepath.Join(dir, m.SlSyncStages.Name),
	}, nil
}

// OpenChurn loads the writer, pinning (or reusing) its maps in dir.
// ringBytes, if not 0, sizes a new ring buffer (a power of two pages).
func OpenChurn(dir string, ringBytes uint32) (*Churn, error) {
	spec, err := loadChurn()
	if err != nil {
		return nil, fmt.Errorf("loading the churn program: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("making %s: %w", dir, err)
	}
	var ms churnMapSpecs
	if err := spec.Assign(&ms); err != nil {
		return nil, err
	}
	for _, m := range []*ebpf.MapSpec{ms.SlChurn, ms.SlSyncChanges, ms.SlSyncLost, ms.SlSyncStages} {
		m.Pinning = ebpf.PinByName
	}
	if ringBytes != 0 {
		ms.SlSyncChanges.MaxEntries = ringBytes
	}
	c := &Churn{Dir: dir}
	if err := spec.LoadAndAssign(&c.objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}}); err != nil {
		return nil, fmt.Errorf("loading the churn program: %w", err)
	}
	return c, nil
}

// Write puts (or, with del, deletes) key through the program, recording
// the change when capture is set.
func (c *Churn) Write(key uint64, val ChurnVal, del, capture bool) error {
	return c.WriteRange(key, 1, val, del, capture)
}

// ChurnBatch is the most keys one WriteRange writes.
const ChurnBatch = int(churnSlSyncLimitsSL_CHURN_BATCH)

// WriteRange writes keys key .. key+count-1 in one run of the program
// (values val.Seq .. val.Seq+count-1), count at most ChurnBatch.
func (c *Churn) WriteRange(key uint64, count int, val ChurnVal, del, capture bool) error {
	if count < 1 || count > ChurnBatch {
		return fmt.Errorf("churn: %d keys in one run, want 1 to %d", count, ChurnBatch)
	}
	a := churnSlChurnArgs{Key: key, Val: val, Count: uint32(count)}
	if del {
		a.Op = uint32(churnSlChurnOpSL_CHURN_DELETE)
	}
	if capture {
		a.Capture = 1
	}
	if _, err := c.objs.SlChurnWrite.Run(&ebpf.RunOptions{Context: &a, ContextOut: &a}); err != nil {
		return fmt.Errorf("running the churn program: %w", err)
	}
	if a.Ret != 0 && (!del || a.Ret != -2) {
		return fmt.Errorf("churn write of key %d: errno %d", key, -a.Ret)
	}
	return nil
}

// Map is the written map.
func (c *Churn) Map() *ebpf.Map { return c.objs.SlChurn }

// Program is the writing program (for its run-time statistics).
func (c *Churn) Program() *ebpf.Program { return c.objs.SlChurnWrite }

// Close releases the handles; the pins stay until Unpin.
func (c *Churn) Close() error { return c.objs.Close() }

// Unpin removes the pins and the directory.
func (c *Churn) Unpin() error {
	var errs []error
	for _, m := range []*ebpf.Map{c.objs.SlChurn, c.objs.SlSyncChanges, c.objs.SlSyncLost, c.objs.SlSyncStages} {
		if m != nil {
			errs = append(errs, m.Unpin())
		}
	}
	errs = append(errs, os.Remove(c.Dir))
	return errors.Join(errs...)
}
