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

// SynRings is, per CPU, the ports of the clients whose SYNs listeners of
// attached cgroups answered last there (where the valve runs; a client that
// finds its own at its handshake's end takes it, clearing it: on_syn in
// sl_establish.h), newest first, those taken left out; and how many a
// ring holds.
func (d *Datapath) SynRings() (ports [][]uint16, size int, err error) {
	var rings []bypassSlSynRing
	if err := d.objs.SlSynRings.Lookup(uint32(0), &rings); err != nil {
		return nil, 0, fmt.Errorf("reading the SYN rings: %w", err)
	}
	out := make([][]uint16, len(rings))
	for cpu, r := range rings {
		n := len(r.Syn)
		for i := range n {
			e := r.Syn[(int(r.Next)-1-i+2*n)%n]
			if e.LocalPort != 0 {
				out[cpu] = append(out[cpu], e.LocalPort)
			}
		}
	}
	return out, len(bypassSlSynRing{}.Syn), nil
}

// SkbSeqs is how many sockets sl_skb_seqs follows: sockets of the valve's
// map that TCP delivered bytes to (sl_skb in bypass.c), until they close.
func (d *Datapath) SkbSeqs() (int, error) {
	n := 0
	err := eachEntry(d.objs.SlSkbSeqs, bypassMapSlSkbSeqs, func(uint64, bypassSlSkbSeq) { n++ })
	return n, err
}
