package statesync

import (
	"errors"
	"fmt"
	"reflect"
	"unsafe"

	"github.com/cilium/ebpf"
)

// mapWriter collects the writes of one apply and makes them in batches
// (BPF_MAP_UPDATE_BATCH, BPF_MAP_DELETE_BATCH) where the map type has
// them. Only a key's last write counts: a version that supersedes one
// still waiting takes its place (replace).
type mapWriter struct {
	tables [][]mapWrite
}

type mapWrite struct {
	key []byte
	en  *entry
}

func newMapWriter(n int) *mapWriter {
	return &mapWriter{tables: make([][]mapWrite, n)}
}

// add writes en for key (a key added once: a read of the map, a prune).
// key must not change before flush.
func (w *mapWriter) add(ti int, key []byte, en *entry) {
	w.tables[ti] = append(w.tables[ti], mapWrite{key, en})
}

// replace writes en for key, in place of cur (the version en replaced in
// the table) if cur is still waiting.
func (w *mapWriter) replace(ti int, key []byte, en, cur *entry) {
	if cur != nil && cur.slot != 0 && int(cur.slot) <= len(w.tables[ti]) && w.tables[ti][cur.slot-1].en == cur {
		w.tables[ti][cur.slot-1].en = en
		en.slot, cur.slot = cur.slot, 0
		return
	}
	w.tables[ti] = append(w.tables[ti], mapWrite{key, en})
	en.slot = int32(len(w.tables[ti]))
}

func (w *mapWriter) flush(e *Engine) error {
	var errs []error
	for ti, writes := range w.tables {
		if len(writes) == 0 {
			continue
		}
		m := e.maps[ti]
		ks, vs := int(m.KeySize()), int(m.ValueSize())
		var puts, vals, dels []byte
		nPut, nDel := 0, 0
		for _, wr := range writes {
			wr.en.slot = 0
			if wr.en.deleted {
				dels = append(dels, wr.key...)
				nDel++
			} else {
				puts, vals = append(puts, wr.key...), append(vals, wr.en.value...)
				nPut++
			}
		}
		if len(puts) != nPut*ks || len(vals) != nPut*vs || len(dels) != nDel*ks {
			errs = append(errs, fmt.Errorf("writing %s: a key or value of the wrong size", e.tables[ti].name))
			continue
		}
		if err := putBatch(m, puts, vals, nPut); err != nil {
			errs = append(errs, fmt.Errorf("writing %s: %w", e.tables[ti].name, err))
		}
		if err := deleteBatch(m, dels, nDel); err != nil {
			errs = append(errs, fmt.Errorf("deleting from %s: %w", e.tables[ti].name, err))
		}
		if ti < len(e.changed) { // engines made by New have one per table
			select {
			case e.changed[ti] <- struct{}{}:
			default:
			}
		}
	}
	return errors.Join(errs...)
}

// byteArrays views n equal-sized byte strings packed in flat as a slice
// of [len(flat)/n]byte, the form cilium/ebpf's batch operations take.
func byteArrays(flat []byte, n int) any {
	size := len(flat) / n
	return reflect.SliceAt(reflect.ArrayOf(size, reflect.TypeFor[byte]()), unsafe.Pointer(&flat[0]), n).Interface()
}

// putBatch writes n keys and values packed in keys and vals.
func putBatch(m *ebpf.Map, keys, vals []byte, n int) error {
	ks, vs := int(m.KeySize()), int(m.ValueSize())
	for i := 0; i < n; i += readBatch {
		j := min(i+readBatch, n)
		_, err := m.BatchUpdate(byteArrays(keys[i*ks:j*ks], j-i), byteArrays(vals[i*vs:j*vs], j-i), nil)
		if errors.Is(err, ebpf.ErrNotSupported) {
			for k := i; k < n; k++ {
				if err := m.Put(keys[k*ks:(k+1)*ks], vals[k*vs:(k+1)*vs]); err != nil {
					return err
				}
			}
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// deleteBatch deletes n keys packed in keys; missing ones are fine (the
// kernel stops a batch at the first, which is then skipped).
func deleteBatch(m *ebpf.Map, keys []byte, n int) error {
	ks := int(m.KeySize())
	for i := 0; i < n; {
		j := min(i+readBatch, n)
		done, err := m.BatchDelete(byteArrays(keys[i*ks:j*ks], j-i), nil)
		i += done
		switch {
		case err == nil:
		case errors.Is(err, ebpf.ErrKeyNotExist):
			i++
		case errors.Is(err, ebpf.ErrNotSupported):
			for ; i < n; i++ {
				if err := m.Delete(keys[i*ks : (i+1)*ks]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					return err
				}
			}
		default:
			return err
		}
	}
	return nil
}
