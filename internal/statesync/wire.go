package statesync

import (
	"fmt"
	"math/bits"

	"github.com/socklane/socklane/internal/syncpb"
)

// rec is one entry as the engine logs, sends and applies it.
type rec struct {
	table    uint32
	deleted  bool
	key      []byte
	value    []byte
	ver      version
	captured int64
}

// pack encodes recs as EntryBatches, a batch for each run of one
// table's entries, so that the batches in order are recs in order.
func pack(recs []rec) []*syncpb.EntryBatch {
	var out []*syncpb.EntryBatch
	for i := 0; i < len(recs); {
		j := i + 1
		for j < len(recs) && recs[j].table == recs[i].table {
			j++
		}
		out = append(out, packRun(recs[i:j]))
		i = j
	}
	return out
}

// packRun encodes entries of one table.
func packRun(recs []rec) *syncpb.EntryBatch {
	n := len(recs)
	ks, vs := len(recs[0].key), 0
	for _, r := range recs {
		if !r.deleted {
			vs = len(r.value)
			break
		}
	}
	b := &syncpb.EntryBatch{
		Table: recs[0].table, Count: uint32(n),
		Keys:        make([]byte, 0, n*ks),
		Values:      make([]byte, 0, n*vs),
		Deleted:     make([]byte, (n+7)/8),
		Generations: make([]uint64, n),
	}
	var captured []int64
	var idx []uint32
	writers := map[originID]uint32{}
	for i, r := range recs {
		b.Keys = append(b.Keys, r.key...)
		if r.deleted {
			b.Deleted[i/8] |= 1 << (i % 8)
		} else {
			b.Values = append(b.Values, r.value...)
		}
		b.Generations[i] = r.ver.gen
		w, ok := writers[r.ver.writer]
		if !ok {
			w = uint32(len(b.Writers))
			writers[r.ver.writer] = w
			b.Writers = append(b.Writers, r.ver.writer.proto())
		}
		if w != 0 && idx == nil {
			idx = make([]uint32, n)
		}
		if idx != nil {
			idx[i] = w
		}
		if r.captured != 0 && captured == nil {
			captured = make([]int64, n)
		}
		if captured != nil {
			captured[i] = r.captured
		}
	}
	b.WriterIndex, b.CapturedUnixNano = idx, captured
	return b
}

// unpack decodes batches into recs (appended to out), checking every
// column against the tables' sizes. The recs' keys and values point into
// the batches.
func unpack(batches []*syncpb.EntryBatch, schemas []*syncpb.TableSchema, out []rec) ([]rec, error) {
	for bi, b := range batches {
		if int(b.GetTable()) >= len(schemas) {
			return out, fmt.Errorf("batch %d is of table %d; the hello named %d", bi, b.GetTable(), len(schemas))
		}
		s := schemas[b.GetTable()]
		ks, vs, n := int(s.GetKeySize()), int(s.GetValueSize()), int(b.GetCount())
		dead := b.GetDeleted()
		if len(dead) != (n+7)/8 {
			return out, fmt.Errorf("batch %d: %d bytes of tombstone bits for %d entries", bi, len(dead), n)
		}
		if n%8 != 0 && dead[len(dead)-1]>>(n%8) != 0 {
			return out, fmt.Errorf("batch %d: tombstone bits past its %d entries", bi, n)
		}
		live := n
		for _, d := range dead {
			live -= bits.OnesCount8(d)
		}
		switch {
		case len(b.GetKeys()) != n*ks:
			return out, fmt.Errorf("batch %d: %d bytes of keys for %d keys of %d bytes", bi, len(b.GetKeys()), n, ks)
		case len(b.GetValues()) != live*vs:
			return out, fmt.Errorf("batch %d: %d bytes of values for %d values of %d bytes", bi, len(b.GetValues()), live, vs)
		case len(b.GetGenerations()) != n:
			return out, fmt.Errorf("batch %d: %d generations for %d entries", bi, len(b.GetGenerations()), n)
		case len(b.GetWriters()) == 0 && n > 0:
			return out, fmt.Errorf("batch %d: no writers", bi)
		case len(b.GetWriterIndex()) != 0 && len(b.GetWriterIndex()) != n:
			return out, fmt.Errorf("batch %d: %d writer indexes for %d entries", bi, len(b.GetWriterIndex()), n)
		case len(b.GetCapturedUnixNano()) != 0 && len(b.GetCapturedUnixNano()) != n:
			return out, fmt.Errorf("batch %d: %d capture times for %d entries", bi, len(b.GetCapturedUnixNano()), n)
		}
		writers := make([]originID, len(b.GetWriters()))
		for i, w := range b.GetWriters() {
			writers[i] = fromProto(w)
		}
		v := 0
		for i := range n {
			r := rec{table: b.GetTable(), key: b.GetKeys()[i*ks : (i+1)*ks : (i+1)*ks], deleted: dead[i/8]&(1<<(i%8)) != 0}
			if !r.deleted {
				r.value = b.GetValues()[v*vs : (v+1)*vs : (v+1)*vs]
				v++
			}
			w := uint32(0)
			if wi := b.GetWriterIndex(); len(wi) != 0 {
				w = wi[i]
			}
			if int(w) >= len(writers) {
				return out, fmt.Errorf("batch %d: entry %d names writer %d of %d", bi, i, w, len(writers))
			}
			r.ver = version{gen: b.GetGenerations()[i], writer: writers[w]}
			if c := b.GetCapturedUnixNano(); len(c) != 0 {
				r.captured = c[i]
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// countBatches is how many entries batches hold.
func countBatches(batches []*syncpb.EntryBatch) int {
	n := 0
	for _, b := range batches {
		n += int(b.GetCount())
	}
	return n
}
