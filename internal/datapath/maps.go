package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

const batchSize = 4096

func batchPut[K, V any](m *ebpf.Map, keys []K, vals []V) error {
	for i := 0; i < len(keys); i += batchSize {
		j := min(i+batchSize, len(keys))
		_, err := m.BatchUpdate(keys[i:j], vals[i:j], nil)
		if errors.Is(err, ebpf.ErrNotSupported) {
			return putEach(m, keys[i:], vals[i:])
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func putEach[K, V any](m *ebpf.Map, keys []K, vals []V) error {
	for i := range keys {
		if err := m.Put(keys[i], vals[i]); err != nil {
			return err
		}
	}
	return nil
}

// readAll reads a whole (not per-CPU) map in batches.
func readAll[K comparable, V any](m *ebpf.Map) (map[K]V, error) {
	out := map[K]V{}
	keys, vals := make([]K, batchSize), make([]V, batchSize)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			out[keys[i]] = vals[i]
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return out, nil
		case errors.Is(err, ebpf.ErrNotSupported):
			return readEach[K, V](m)
		case err != nil:
			return nil, err
		}
	}
}

func readEach[K comparable, V any](m *ebpf.Map) (map[K]V, error) {
	out := map[K]V{}
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	return out, it.Err()
}

// deleteAll deletes keys in batches; missing ones are fine. The kernel
// deletes a batch in order and stops at the first missing key, which is
// skipped.
func deleteAll[K any](m *ebpf.Map, keys []K) error {
	for i := 0; i < len(keys); {
		j := min(i+batchSize, len(keys))
		n, err := m.BatchDelete(keys[i:j], nil)
		i += n
		switch {
		case err == nil:
		case errors.Is(err, ebpf.ErrKeyNotExist):
			i++
		case errors.Is(err, ebpf.ErrNotSupported):
			return deleteEach(m, keys[i:])
		default:
			return err
		}
	}
	return nil
}

func deleteEach[K any](m *ebpf.Map, keys []K) error {
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

// eachEntry calls fn for every entry of a hash map; what names the map in
// errors.
func eachEntry[K, V any](m *ebpf.Map, what string, fn func(K, V)) error {
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		fn(k, v)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading %s: %w", what, err)
	}
	return nil
}

// LocalSyns is how many SYNs sl_local_syns holds for clients of this node
// (answered by a listener of an attached cgroup where the valve runs; a
// client that finds its own at its handshake's end takes it: on_syn in
// sl_establish.h), and how many it can hold: an LRU, whose oldest go first.
func (d *Datapath) LocalSyns() (held, capacity int, err error) {
	err = eachEntry(d.objs.SlLocalSyns, bypassMapSlLocalSyns, func(bypassSlTuple, uint8) { held++ })
	return held, int(d.objs.SlLocalSyns.MaxEntries()), err
}
