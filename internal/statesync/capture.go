package statesync

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
)

const readBatch = 4096

// How often the change records are read: while they flow, and once none
// came for a while (the writer does not wake the reader).
const (
	recordPoll      = time.Millisecond
	recordIdlePoll  = 10 * time.Millisecond
	recordIdleAfter = 100 * time.Millisecond
	// recordsPerRead bounds the keys taken from the ring at once; when
	// it held more, the next read follows without a pause.
	recordsPerRead = 8192
)

// scanMap reads every key and value of a map in batches (batched
// lookups where the map type has them, else one key at a time) and hands
// each batch to fn; the slices are reused after fn returns.
func scanMap(m *ebpf.Map, fn func(keys, vals [][]byte)) error {
	ks, vs := int(m.KeySize()), int(m.ValueSize())
	keys := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(ks, reflect.TypeFor[byte]())), readBatch, readBatch)
	vals := reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(vs, reflect.TypeFor[byte]())), readBatch, readBatch)
	kbuf := unsafe.Slice((*byte)(keys.UnsafePointer()), ks*readBatch)
	vbuf := unsafe.Slice((*byte)(vals.UnsafePointer()), vs*readBatch)
	kv, vv := make([][]byte, readBatch), make([][]byte, readBatch)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys.Interface(), vals.Interface(), nil)
		if errors.Is(err, ebpf.ErrNotSupported) {
			return scanEach(m, fn)
		}
		for i := range n {
			kv[i], vv[i] = kbuf[i*ks:(i+1)*ks], vbuf[i*vs:(i+1)*vs]
		}
		if n > 0 {
			fn(kv[:n], vv[:n])
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return nil
		case err != nil:
			return fmt.Errorf("reading the map: %w", err)
		}
	}
}

func scanEach(m *ebpf.Map, fn func(keys, vals [][]byte)) error {
	key := make([]byte, m.KeySize())
	val := make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(&key, &val) {
		fn([][]byte{key}, [][]byte{val})
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading the map: %w", err)
	}
	return nil
}

// readMap reads a whole map into memory.
func readMap(m *ebpf.Map) (map[string][]byte, error) {
	out := map[string][]byte{}
	err := scanMap(m, func(keys, vals [][]byte) {
		for i := range keys {
			out[string(keys[i])] = append([]byte(nil), vals[i]...)
		}
	})
	return out, err
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
	switch {
	case tc.Changes != "":
		e.setCapture(ti, CaptureRecords)
		err := e.follow(ctx, ti, tc)
		if ctx.Err() != nil {
			return
		}
		e.log.Error("sync: change records unreadable, reading the map instead", "table", tc.Name, "err", err)
	case !tc.NoTrace:
		tr, err := newTracer(e.maps[ti], tc.Record)
		if err != nil {
			e.log.Info("sync: capturing by reading the map every poll interval: the kernel's map updates cannot be traced here",
				"table", tc.Name, "poll", tc.Poll, "reason", err)
			e.setCaptureWhy(ti, err.Error())
			break
		}
		e.setCapture(ti, CaptureTrace)
		e.log.Info("sync: capturing by tracing the kernel's map updates", "table", tc.Name)
		err = e.followRecords(ctx, ti, tc, tr.source())
		tr.close()
		if ctx.Err() != nil {
			return
		}
		e.log.Error("sync: traced map updates unreadable, reading the map instead", "table", tc.Name, "err", err)
	}
	e.setCapture(ti, CapturePoll)
	tick := time.NewTicker(tc.Poll)
	defer tick.Stop()
	for {
		if err := e.rescan(ti); err != nil {
			e.log.Warn("sync: reading the map", "table", tc.Name, "err", err)
		}
		e.mu.Lock()
		again := e.recheck[ti]
		e.recheck[ti] = nil
		e.mu.Unlock()
		if len(again) > 0 {
			if err := e.publishKeys(ti, again); err != nil {
				e.log.Warn("sync: reading the map", "table", tc.Name, "err", err)
			}
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
// next read. The map is compared a batch at a time; a key the read found
// is marked, so that the live entries left unmarked are the deleted ones.
func (e *Engine) rescan(ti int) error {
	e.mu.Lock()
	t := e.tables[ti]
	t.epoch++
	epoch := t.epoch
	mark := e.nextMark()
	publish := e.publishes(ti)
	e.mu.Unlock()
	now := time.Now().UnixNano()
	changed := 0
	var fixes []change
	err := scanMap(e.maps[ti], func(keys, vals [][]byte) {
		e.mu.Lock()
		defer e.mu.Unlock()
		for i, k := range keys {
			en := t.entries[string(k)]
			if en != nil {
				en.mark = mark
			}
			if !t.differs(k, vals[i]) {
				continue
			}
			if en != nil && en.epoch == epoch {
				// A peer's version came in while the map was read:
				// the key is read again once nothing intervenes.
				e.recheck[ti] = append(e.recheck[ti], clone(k))
				continue
			}
			changed++
			switch {
			case publish:
				e.record(ti, string(k), clone(vals[i]), false, now)
				t.entries[string(k)].mark = mark
			case en != nil && !en.deleted:
				fixes = append(fixes, change{key: clone(k), value: en.value})
			default:
				fixes = append(fixes, change{key: clone(k)})
			}
		}
	})
	if err != nil {
		return err
	}
	e.stats.polls.Add(1)
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, en := range t.entries {
		if en.deleted || en.mark == mark {
			continue
		}
		if en.epoch == epoch {
			e.recheck[ti] = append(e.recheck[ti], []byte(k))
			continue
		}
		changed++
		if publish {
			e.record(ti, k, nil, true, now)
		} else {
			fixes = append(fixes, change{key: []byte(k), value: en.value})
		}
	}
	if changed > 0 {
		e.stats.pollChanges.Add(uint64(changed))
		e.notify()
	}
	w := newMapWriter(len(e.tables))
	for _, f := range fixes {
		w.add(ti, f.key, &entry{value: f.value, deleted: f.value == nil})
	}
	return w.flush(e)
}

// recordSource is where a table's change records come from: the ring,
// the loss counter and the stages (nil: none) of its writers, or of the
// tracer.
type recordSource struct {
	ring, lost *ebpf.Map
	stages     *stageReader
	what       string // for errors
}

// follow reads the change records the writers pinned in tc.Changes
// until ctx ends; it returns an error when they cannot be used.
func (e *Engine) follow(ctx context.Context, ti int, tc TableConfig) error {
	pins, err := changePins(tc.Changes)
	if err != nil {
		return err
	}
	ringMap, err := ebpf.LoadPinnedMap(pins.ring, nil)
	if err != nil {
		return fmt.Errorf("opening the change records %s: %w", pins.ring, err)
	}
	defer ringMap.Close()
	lostMap, err := ebpf.LoadPinnedMap(pins.lost, nil)
	if err != nil {
		return fmt.Errorf("opening the loss counter %s: %w", pins.lost, err)
	}
	defer lostMap.Close()
	stages, err := openStages(pins.stages)
	if err != nil {
		return err
	}
	defer stages.close()
	return e.followRecords(ctx, ti, tc, recordSource{ring: ringMap, lost: lostMap, stages: stages, what: pins.ring})
}

// followRecords reads change records from src until ctx ends; it
// returns an error when they cannot be used.
func (e *Engine) followRecords(ctx context.Context, ti int, tc TableConfig, src recordSource) error {
	lostMap, stages := src.lost, src.stages
	rd, err := ringbuf.NewReader(src.ring)
	if err != nil {
		return fmt.Errorf("reading %s: %w", src.what, err)
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
	keys := make([][]byte, 0, recordsPerRead+int(churnSlSyncLimitsSL_SYNC_STAGE_BYTES))
	ks := int(e.maps[ti].KeySize())
	// Records come without a wakeup (sl_sync.h submits them with
	// BPF_RB_NO_WAKEUP: a wakeup for every record that finds the reader
	// caught up cost the writer more than the record itself), so the
	// ring is read every recordPoll while records flow, and every
	// recordIdlePoll once none came for recordIdleAfter.
	// The reader's own deadline cannot be the pause: the kernel waits
	// whole milliseconds, and one under 1 ms does not wait at all.
	poll, lastRecord := recordPoll, time.Now()
	pause := time.NewTimer(poll)
	defer pause.Stop()
	for full := false; ; {
		if !full {
			pause.Reset(poll)
			select {
			case <-ctx.Done():
				return nil
			case <-pause.C:
			}
		}
		// What the ring holds now, without waiting.
		rd.SetDeadline(time.Now())
		keys = keys[:0]
		for len(keys) < recordsPerRead {
			if err := rd.ReadInto(&rec); err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, ringbuf.ErrFlushed) {
					break
				}
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			keys = recordKeys(rec.RawSample, tc.Record, ks, keys)
		}
		full = len(keys) >= recordsPerRead
		// Records still staged on their CPUs (read after the ring: a
		// stage written out meanwhile is in the ring's next read).
		if err := stages.read(func(raw []byte) { keys = recordKeys(raw, tc.Record, ks, keys) }); err != nil {
			return err
		}
		switch now := time.Now(); {
		case len(keys) > 0:
			poll, lastRecord = recordPoll, now
		case now.Sub(lastRecord) > recordIdleAfter:
			poll = recordIdlePoll
		}
		if n := lost(); n != seenLost {
			e.stats.lost.Add(n - seenLost)
			e.event(EventRecordsLost, "", tc.Name, fmt.Sprintf("%d change records lost (the ring buffer was full): reading the whole map", n-seenLost), "lost", n-seenLost)
			seenLost = n
			if err := e.rescan(ti); err != nil {
				return err
			}
			continue
		}
		e.mu.Lock()
		keys = append(keys, e.recheck[ti]...)
		e.recheck[ti] = nil
		e.mu.Unlock()
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

// change is a key and the value the map holds for it (nil: none).
type change struct {
	key, value []byte
}

// distinct drops repeated keys (a key written many times is read once).
func distinct(keys [][]byte) [][]byte {
	seen := make(map[string]bool, len(keys))
	out := keys[:0]
	for _, k := range keys {
		if !seen[string(k)] {
			seen[string(k)] = true
			out = append(out, k)
		}
	}
	return out
}

// publishKeys reads the keys' values now and makes changes of those
// that differ from what was synced.
func (e *Engine) publishKeys(ti int, keys [][]byte) error {
	keys = distinct(keys)
	e.mu.Lock()
	t := e.tables[ti]
	t.epoch++
	epoch := t.epoch
	e.mu.Unlock()
	m := e.maps[ti]
	vals := make([][]byte, len(keys))
	vs := int(m.ValueSize())
	buf := make([]byte, vs*len(keys))
	keep := func(i int, v []byte) {
		if v != nil {
			vals[i] = buf[i*vs : (i+1)*vs : (i+1)*vs]
			copy(vals[i], v)
		}
	}
	var err error
	if r := e.readers[ti]; r != nil {
		err = r.read(keys, keep)
	} else {
		err = lookupKeys(m, keys, keep)
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", t.name, err)
	}
	now := time.Now().UnixNano()
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.publishes(ti) {
		// A standby mirrors: what a local writer changed is put back.
		w := newMapWriter(len(e.tables))
		for i, k := range keys {
			en := t.entries[string(k)]
			if !t.differs(k, vals[i]) {
				continue
			}
			if en != nil && en.epoch == epoch {
				e.recheck[ti] = append(e.recheck[ti], k)
				continue
			}
			if en == nil {
				en = &entry{deleted: true}
			}
			w.add(ti, k, en)
		}
		return w.flush(e)
	}
	n := 0
	for i, k := range keys {
		// One lookup of the key serves the compare, the epoch check
		// and the replacement.
		cur := t.entries[string(k)]
		if !differsFrom(cur, vals[i]) {
			continue
		}
		if cur != nil && cur.epoch == epoch {
			// A peer's version came in between the read and now: the
			// map may hold it, or a local write made after it. Read
			// the key again once nothing intervenes.
			e.recheck[ti] = append(e.recheck[ti], k)
			continue
		}
		e.recordOver(ti, string(k), vals[i], vals[i] == nil, now, cur)
		n++
	}
	if n > 0 {
		e.notify()
	}
	return nil
}
