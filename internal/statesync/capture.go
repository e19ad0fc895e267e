package statesync

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"reflect"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
)

const readBatch = 4096

// readMap reads every key and value of a map: batched lookups where the
// map type has them, else one key at a time.
func readMap(m *ebpf.Map) (map[string][]byte, error) {
	ks, vs := int(m.KeySize()), int(m.ValueSize())
	out := map[string][]byte{}
	keys := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(ks, reflect.TypeFor[byte]())), readBatch, readBatch)
	vals := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(vs, reflect.TypeFor[byte]())), readBatch, readBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys.Interface(), vals.Interface(), nil)
		for i := range n {
			out[string(keys.Index(i).Bytes())] = append([]byte(nil), vals.Index(i).Bytes()...)
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return out, nil
		case errors.Is(err, ebpf.ErrNotSupported):
			return readEach(m)
		case err != nil:
			return nil, fmt.Errorf("reading the map: %w", err)
		}
	}
}

func readEach(m *ebpf.Map) (map[string][]byte, error) {
	out := map[string][]byte{}
	key := make([]byte, m.KeySize())
	val := make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(&key, &val) {
		out[string(key)] = append([]byte(nil), val...)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading the map: %w", err)
	}
	return out, nil
}

// capture turns writes to table ti's map into changes: from its change
// records when it has them (reading the whole map again only when
// records were lost), otherwise by reading and diffing the map every
// poll interval. It starts once the peers' state is in.
func (e *Engine) capture(ctx context.Context, ti int) {
	select {
	case <-ctx.Done():
		return
	case <-e.bootstrapped:
	}
	tc := e.cfg.Tables[ti]
	if tc.Changes != "" {
		if err := e.follow(ctx, ti, tc); err != nil && ctx.Err() == nil {
			e.log.Error("sync: change records unreadable, reading the map instead", "table", tc.Name, "err", err)
		}
	}
	tick := time.NewTicker(tc.Poll)
	defer tick.Stop()
	for {
		if err := e.rescan(ti); err != nil {
			e.log.Warn("sync: reading the map", "table", tc.Name, "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// rescan reads the whole map and makes a change of every difference from
// what was synced. A standby instead puts the map back to the synced
// state. A key a peer wrote while the map was being read is left for the
// next read.
func (e *Engine) rescan(ti int) error {
	e.mu.Lock()
	t := e.tables[ti]
	t.epoch++
	epoch := t.epoch
	e.mu.Unlock()
	dump, err := readMap(e.maps[ti])
	if err != nil {
		return err
	}
	e.stats.polls.Add(1)
	now := time.Now().UnixNano()
	e.mu.Lock()
	defer e.mu.Unlock()
	changed := 0
	publish := e.publishes(ti)
	var firstErr error
	fix := func(k string, en *entry) {
		if err := e.writeMap(ti, []byte(k), en); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	for k, v := range dump {
		if !t.differs([]byte(k), v) {
			continue
		}
		en := t.entries[k]
		if en != nil && en.epoch == epoch {
			continue
		}
		changed++
		if publish {
			e.record(ti, []byte(k), v, false, now)
		} else if en != nil {
			fix(k, en)
		} else {
			fix(k, &entry{deleted: true})
		}
	}
	for k, en := range t.entries {
		if en.deleted || en.epoch == epoch {
			continue
		}
		if _, ok := dump[k]; ok {
			continue
		}
		changed++
		if publish {
			e.record(ti, []byte(k), nil, true, now)
		} else {
			fix(k, en)
		}
	}
	if changed > 0 {
		e.stats.pollChanges.Add(uint64(changed))
		e.notify()
	}
	return firstErr
}

// follow reads change records until ctx ends; it returns an error when
// the ring buffer cannot be used.
func (e *Engine) follow(ctx context.Context, ti int, tc TableConfig) error {
	ringPin, lostPin, err := changePins(tc.Changes)
	if err != nil {
		return err
	}
	ringMap, err := ebpf.LoadPinnedMap(ringPin, nil)
	if err != nil {
		return fmt.Errorf("opening the change records %s: %w", ringPin, err)
	}
	defer ringMap.Close()
	lostMap, err := ebpf.LoadPinnedMap(lostPin, nil)
	if err != nil {
		return fmt.Errorf("opening the loss counter %s: %w", lostPin, err)
	}
	defer lostMap.Close()
	rd, err := ringbuf.NewReader(ringMap)
	if err != nil {
		return fmt.Errorf("reading %s: %w", ringPin, err)
	}
	go func() {
		<-ctx.Done()
		rd.Close()
	}()
	lost := func() uint64 {
		var n uint64
		_ = lostMap.Lookup(uint32(0), &n)
		return n
	}
	seenLost := lost()
	// Whatever was written before the records were followed.
	if err := e.rescan(ti); err != nil {
		return err
	}
	var rec ringbuf.Record
	keys := make([][]byte, 0, 512)
	ks := int(e.maps[ti].KeySize())
	for {
		rd.SetDeadline(time.Now().Add(100 * time.Millisecond))
		keys = keys[:0]
		for len(keys) < cap(keys) {
			if err := rd.ReadInto(&rec); err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, ringbuf.ErrFlushed) {
					break
				}
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			if k, ok := recordKey(rec.RawSample, tc.Record, ks); ok {
				keys = append(keys, k)
			}
			rd.SetDeadline(time.Now())
		}
		if n := lost(); n != seenLost {
			e.stats.lost.Add(n - seenLost)
			e.log.Warn("sync: change records lost, reading the whole map", "table", tc.Name, "lost", n-seenLost)
			seenLost = n
			if err := e.rescan(ti); err != nil {
				return err
			}
			continue
		}
		if len(keys) > 0 {
			if err := e.publishKeys(ti, keys); err != nil {
				return err
			}
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// recordKey is the key a change record names, if it is table's.
func recordKey(raw []byte, table uint32, keySize int) ([]byte, bool) {
	if len(raw) < 8 {
		return nil, false
	}
	if binary.NativeEndian.Uint32(raw[0:4]) != table {
		return nil, false
	}
	n := int(binary.NativeEndian.Uint32(raw[4:8]))
	if n != keySize || 8+n > len(raw) {
		return nil, false
	}
	return append([]byte(nil), raw[8:8+n]...), true
}

// publishKeys reads the keys' values now and makes changes of those that
// differ from what was synced.
func (e *Engine) publishKeys(ti int, keys [][]byte) error {
	e.mu.Lock()
	t := e.tables[ti]
	t.epoch++
	epoch := t.epoch
	e.mu.Unlock()
	m := e.maps[ti]
	vals := make([][]byte, len(keys))
	for i, k := range keys {
		v := make([]byte, m.ValueSize())
		err := m.Lookup(k, &v)
		switch {
		case err == nil:
			vals[i] = v
		case errors.Is(err, ebpf.ErrKeyNotExist):
		default:
			return fmt.Errorf("reading %s: %w", t.name, err)
		}
	}
	now := time.Now().UnixNano()
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.publishes(ti) {
		return nil
	}
	n := 0
	for i, k := range keys {
		if !t.differs(k, vals[i]) {
			continue
		}
		if en := t.entries[string(k)]; en != nil && en.epoch == epoch {
			continue
		}
		e.record(ti, k, vals[i], vals[i] == nil, now)
		n++
	}
	if n > 0 {
		e.notify()
	}
	return nil
}
