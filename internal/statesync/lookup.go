package statesync

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cilium/ebpf"
)

// batchReader reads given keys of a map a few thousand at a time: it
// writes them into lookup.c's buffer and runs the program once, where
// BPF_MAP_LOOKUP_ELEM takes a system call a key. The program is loaded
// against the synced map itself (its type and sizes copied into the
// placeholder's spec).
type batchReader struct {
	mu   sync.Mutex
	objs lookupObjects
	mem  *ebpf.Memory
	cfg  lookupSlSyncLookupCfg
	buf  []byte
}

// Limits of what the batched lookup reads.
const (
	lookupIOBytes  = int(churnSlSyncLimitsSL_SYNC_IO_BYTES)
	lookupMaxKey   = int(churnSlSyncLimitsSL_SYNC_MAX_KEY)
	lookupMaxValue = int(churnSlSyncLimitsSL_SYNC_MAX_VALUE)
)

// newBatchReader loads the batched lookup for m. An error means the
// kernel or the map does not allow it; the caller reads key by key.
func newBatchReader(m *ebpf.Map) (*batchReader, error) {
	ks, vs := int(m.KeySize()), int(m.ValueSize())
	if ks > lookupMaxKey || vs > lookupMaxValue || vs == 0 {
		return nil, fmt.Errorf("keys of %d bytes and values of %d: the batched lookup reads keys of up to %d and values of 1 to %d", ks, vs, lookupMaxKey, lookupMaxValue)
	}
	spec, err := loadLookup()
	if err != nil {
		return nil, fmt.Errorf("loading the batched lookup: %w", err)
	}
	var s lookupSpecs
	if err := spec.Assign(&s); err != nil {
		return nil, fmt.Errorf("loading the batched lookup: %w", err)
	}
	t := s.SlSyncTarget
	t.Type, t.KeySize, t.ValueSize, t.MaxEntries, t.Flags = m.Type(), m.KeySize(), m.ValueSize(), m.MaxEntries(), m.Flags()
	t.Key, t.Value = nil, nil
	n := lookupIOBytes / (ks + vs + 1)
	cfg := lookupSlSyncLookupCfg{
		KeySize: uint32(ks), ValueSize: uint32(vs), Max: uint32(n),
		ValuesOff: uint32(n * ks), FoundOff: uint32(n * (ks + vs)),
	}
	if err := s.LookupCfg.Set(cfg); err != nil {
		return nil, fmt.Errorf("setting the batched lookup's sizes: %w", err)
	}
	r := &batchReader{cfg: cfg, buf: make([]byte, lookupIOBytes)}
	opts := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{t.Name: m}}
	if err := spec.LoadAndAssign(&r.objs, opts); err != nil {
		return nil, fmt.Errorf("loading the batched lookup: %w", err)
	}
	if r.mem, err = r.objs.SlSyncIo.Memory(); err != nil {
		r.objs.Close()
		return nil, fmt.Errorf("mapping the batched lookup's buffer: %w", err)
	}
	return r, nil
}

// close releases the program and its buffer (not the synced map).
func (r *batchReader) close() {
	if r != nil {
		r.objs.Close()
	}
}

// read looks keys up and hands fn each one's value (nil: absent); the
// value is reused after fn returns.
func (r *batchReader) read(keys [][]byte, fn func(i int, val []byte)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	ks, vs, n := int(r.cfg.KeySize), int(r.cfg.ValueSize), int(r.cfg.Max)
	for first := 0; first < len(keys); first += n {
		batch := keys[first:min(first+n, len(keys))]
		kb := r.buf[:len(batch)*ks]
		for i, k := range batch {
			if len(k) != ks {
				return fmt.Errorf("a key of %d bytes for a map of %d", len(k), ks)
			}
			copy(kb[i*ks:], k)
		}
		if _, err := r.mem.WriteAt(kb, 0); err != nil {
			return fmt.Errorf("writing keys to the batched lookup: %w", err)
		}
		args := lookupSlSyncLookupArgs{Count: uint32(len(batch))}
		if _, err := r.objs.SlSyncLookup.Run(&ebpf.RunOptions{Context: &args, ContextOut: &args}); err != nil {
			return fmt.Errorf("running the batched lookup: %w", err)
		}
		if int(args.Done) != len(batch) {
			return fmt.Errorf("the batched lookup read %d of %d keys", args.Done, len(batch))
		}
		vals := r.buf[:len(batch)*vs]
		found := r.buf[len(vals) : len(vals)+len(batch)]
		if _, err := r.mem.ReadAt(vals, int64(r.cfg.ValuesOff)); err != nil {
			return fmt.Errorf("reading the batched lookup's values: %w", err)
		}
		if _, err := r.mem.ReadAt(found, int64(r.cfg.FoundOff)); err != nil {
			return fmt.Errorf("reading the batched lookup's values: %w", err)
		}
		for i := range batch {
			if found[i] == 0 {
				fn(first+i, nil)
			} else {
				fn(first+i, vals[i*vs:(i+1)*vs:(i+1)*vs])
			}
		}
	}
	return nil
}

// lookupKeys reads keys one system call each (where the batched lookup
// cannot be loaded).
func lookupKeys(m *ebpf.Map, keys [][]byte, fn func(i int, val []byte)) error {
	v := make([]byte, m.ValueSize())
	for i, k := range keys {
		err := m.Lookup(k, v)
		switch {
		case err == nil:
			fn(i, v)
		case errors.Is(err, ebpf.ErrKeyNotExist):
			fn(i, nil)
		default:
			return err
		}
	}
	return nil
}
