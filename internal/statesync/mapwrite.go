package statesync

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/cilium/ebpf"
)

// mapWriter collects the writes of one apply and makes them in batches
// (BPF_MAP_UPDATE_BATCH, BPF_MAP_DELETE_BATCH) where the map type has
// them. Only a key's last write counts.
type mapWriter struct {
	tables []map[string]*entry
}

func newMapWriter(n int) *mapWriter {
	return &mapWriter{tables: make([]map[string]*entry, n)}
}

func (w *mapWriter) add(ti int, key []byte, en *entry) {
	if w.tables[ti] == nil {
		w.tables[ti] = map[string]*entry{}
	}
	w.tables[ti][string(key)] = en
}

func (w *mapWriter) flush(e *Engine) error {
	var errs []error
	for ti, writes := range w.tables {
		if len(writes) == 0 {
			continue
		}
		m := e.maps[ti]
		var puts, putVals, dels [][]byte
		for k, en := range writes {
			if en.deleted {
				dels = append(dels, []byte(k))
			} else {
				puts, putVals = append(puts, []byte(k)), append(putVals, en.value)
			}
		}
		if err := putBatch(m, puts, putVals); err != nil {
			errs = append(errs, fmt.Errorf("writing %s: %w", e.tables[ti].name, err))
		}
		if err := deleteBatch(m, dels); err != nil {
			errs = append(errs, fmt.Errorf("deleting from %s: %w", e.tables[ti].name, err))
		}
	}
	return errors.Join(errs...)
}

// byteArrays packs equal-sized byte strings into a slice of [n]byte, the
// form cilium/ebpf's batch operations take.
func byteArrays(items [][]byte, size int) any {
	s := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(size, reflect.TypeFor[byte]())), len(items), len(items))
	for i, b := range items {
		reflect.Copy(s.Index(i), reflect.ValueOf(b))
	}
	return s.Interface()
}

func putBatch(m *ebpf.Map, keys, vals [][]byte) error {
	for i := 0; i < len(keys); i += readBatch {
		j := min(i+readBatch, len(keys))
		_, err := m.BatchUpdate(byteArrays(keys[i:j], int(m.KeySize())), byteArrays(vals[i:j], int(m.ValueSize())), nil)
		if errors.Is(err, ebpf.ErrNotSupported) {
			for k := i; k < len(keys); k++ {
				if err := m.Put(keys[k], vals[k]); err != nil {
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

// deleteBatch deletes keys; missing ones are fine (the kernel stops a
// batch at the first, which is then skipped).
func deleteBatch(m *ebpf.Map, keys [][]byte) error {
	for i := 0; i < len(keys); {
		j := min(i+readBatch, len(keys))
		n, err := m.BatchDelete(byteArrays(keys[i:j], int(m.KeySize())), nil)
		i += n
		switch {
		case err == nil:
		case errors.Is(err, ebpf.ErrKeyNotExist):
			i++
		case errors.Is(err, ebpf.ErrNotSupported):
			for ; i < len(keys); i++ {
				if err := m.Delete(keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					return err
				}
			}
		default:
			return err
		}
	}
	return nil
}
