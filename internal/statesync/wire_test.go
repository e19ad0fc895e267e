package statesync

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/socklane/socklane/internal/syncpb"
	"google.golang.org/protobuf/proto"
)

// wireSchemas: table 0 has 8-byte keys and 16-byte values, table 1
// 4-byte keys and 3-byte values.
var wireSchemas = []*syncpb.TableSchema{{Name: "a", KeySize: 8, ValueSize: 16}, {Name: "b", KeySize: 4, ValueSize: 3}}

func wireRec(table uint32, i int, deleted bool, writer originID, captured int64) rec {
	ks, vs := int(wireSchemas[table].GetKeySize()), int(wireSchemas[table].GetValueSize())
	r := rec{table: table, key: bytes.Repeat([]byte{byte(i)}, ks), deleted: deleted, ver: version{gen: uint64(1000 + i), writer: writer}, captured: captured}
	if !deleted {
		r.value = bytes.Repeat([]byte{byte(i) ^ 0xa5}, vs)
	}
	return r
}

// TestPackRoundTrip: entries packed, marshalled, unmarshalled and
// unpacked are the entries, in order.
func TestPackRoundTrip(t *testing.T) {
	x, y := originID{"node-x", 7}, originID{"node-y", 9}
	cases := []struct {
		name string
		recs []rec
	}{
		{"one", []rec{wireRec(0, 1, false, x, 0)}},
		{"tombstones only", []rec{wireRec(1, 1, true, x, 5), wireRec(1, 2, true, x, 6)}},
		{"nine with a tombstone in the second byte of bits", func() []rec {
			var rs []rec
			for i := range 9 {
				rs = append(rs, wireRec(0, i, i == 8, x, int64(i)))
			}
			return rs
		}()},
		{"two writers, runs of two tables", []rec{
			wireRec(0, 1, false, x, 0), wireRec(0, 2, true, y, 0), wireRec(1, 3, false, y, 11),
			wireRec(1, 4, false, x, 0), wireRec(0, 5, false, x, 12), wireRec(0, 6, true, y, 0),
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := proto.Marshal(&syncpb.Changes{FirstSeq: 1, Batches: pack(tc.recs)})
			if err != nil {
				t.Fatal(err)
			}
			var ch syncpb.Changes
			if err := proto.Unmarshal(raw, &ch); err != nil {
				t.Fatal(err)
			}
			got, err := unpack(ch.GetBatches(), wireSchemas, nil)
			if err != nil {
				t.Fatal(err)
			}
			if countBatches(ch.GetBatches()) != len(tc.recs) {
				t.Errorf("batches count %d entries, want %d", countBatches(ch.GetBatches()), len(tc.recs))
			}
			if a, b := fmt.Sprint(got), fmt.Sprint(tc.recs); a != b {
				t.Fatalf("unpacked\n%s\nwant\n%s", a, b)
			}
		})
	}
}

// TestUnpackRefuses: a batch whose columns do not add up is refused,
// naming what is wrong.
func TestUnpackRefuses(t *testing.T) {
	x := originID{"node-x", 7}
	good := func() *syncpb.EntryBatch {
		return pack([]rec{wireRec(0, 1, false, x, 0), wireRec(0, 2, true, x, 0), wireRec(0, 3, false, x, 0)})[0]
	}
	cases := []struct {
		name string
		bad  func(b *syncpb.EntryBatch)
		want string
	}{
		{"unknown table", func(b *syncpb.EntryBatch) { b.Table = 2 }, "hello named 2"},
		{"short keys", func(b *syncpb.EntryBatch) { b.Keys = b.Keys[1:] }, "bytes of keys"},
		{"count past the columns", func(b *syncpb.EntryBatch) { b.Count = 1 << 31 }, "tombstone bits"},
		{"values for a tombstone", func(b *syncpb.EntryBatch) { b.Values = append(b.Values, make([]byte, 16)...) }, "bytes of values"},
		{"bits past the entries", func(b *syncpb.EntryBatch) { b.Deleted[0] |= 0x80 }, "past its 3"},
		{"missing generation", func(b *syncpb.EntryBatch) { b.Generations = b.Generations[:2] }, "generations"},
		{"no writers", func(b *syncpb.EntryBatch) { b.Writers = nil }, "no writers"},
		{"writer out of range", func(b *syncpb.EntryBatch) { b.WriterIndex = []uint32{0, 1, 0} }, "names writer 1 of 1"},
		{"short writer index", func(b *syncpb.EntryBatch) { b.WriterIndex = []uint32{0} }, "writer indexes"},
		{"short capture times", func(b *syncpb.EntryBatch) { b.CapturedUnixNano = []int64{1} }, "capture times"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := unpack([]*syncpb.EntryBatch{good()}, wireSchemas, nil); err != nil {
				t.Fatalf("the good batch is refused: %v", err)
			}
			b := good()
			tc.bad(b)
			_, err := unpack([]*syncpb.EntryBatch{b}, wireSchemas, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// FuzzUnpack: whatever a peer sends, unpack does not panic, and what it
// accepts packs back to the same entries.
func FuzzUnpack(f *testing.F) {
	x, y := originID{"node-x", 7}, originID{"node-y", 9}
	seed, _ := proto.Marshal(&syncpb.Changes{Batches: pack([]rec{wireRec(0, 1, false, x, 3), wireRec(0, 2, true, y, 0), wireRec(1, 3, false, x, 0)})})
	f.Add(seed)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, raw []byte) {
		var ch syncpb.Changes
		if proto.Unmarshal(raw, &ch) != nil {
			return
		}
		got, err := unpack(ch.GetBatches(), wireSchemas, nil)
		if err != nil {
			return
		}
		again, err := unpack(pack(got), wireSchemas, nil)
		if err != nil {
			t.Fatalf("repacking what was accepted: %v", err)
		}
		if a, b := fmt.Sprint(again), fmt.Sprint(got); a != b {
			t.Fatalf("repacked\n%s\nwant\n%s", a, b)
		}
	})
}
