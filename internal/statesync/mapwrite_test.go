package statesync

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/syncpb"
	"github.com/socklane/socklane/internal/testutil"
)

// TestApplyLastVersionWins: versions of one key that arrive together,
// in any order and mixing puts with deletes, leave the map with the
// newest one (puts and deletes are batched separately, so a superseded
// write must not be made).
func TestApplyLastVersionWins(t *testing.T) {
	testutil.RequireRoot(t)
	w := originID{"node-w", 1}
	val := func(b byte) []byte { return bytes.Repeat([]byte{b}, 4) }
	put := func(k uint64, gen uint64, v byte) rec {
		return rec{key: binary.LittleEndian.AppendUint64(nil, k), value: val(v), ver: version{gen: gen, writer: w}}
	}
	del := func(k uint64, gen uint64) rec {
		return rec{key: binary.LittleEndian.AppendUint64(nil, k), deleted: true, ver: version{gen: gen, writer: w}}
	}
	cases := []struct {
		name string
		recs []rec
		want map[uint64][]byte // nil value: absent
	}{
		{"put then delete", []rec{put(1, 1, 'a'), del(1, 2)}, map[uint64][]byte{1: nil}},
		{"delete then put", []rec{del(1, 1), put(1, 2, 'b')}, map[uint64][]byte{1: val('b')}},
		{"put, delete, put", []rec{put(1, 1, 'a'), del(1, 2), put(1, 3, 'c')}, map[uint64][]byte{1: val('c')}},
		{"newest first", []rec{put(1, 3, 'c'), del(1, 2), put(1, 1, 'a')}, map[uint64][]byte{1: val('c')}},
		{"two keys interleaved", []rec{put(1, 1, 'a'), put(2, 2, 'x'), del(1, 3), del(2, 4), put(2, 5, 'y')},
			map[uint64][]byte{1: nil, 2: val('y')}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 8, ValueSize: 4, MaxEntries: 16})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			// The map holds an old value of every key first.
			for k := range tc.want {
				if err := m.Put(k, val('0')); err != nil {
					t.Fatal(err)
				}
			}
			e := &Engine{maps: []*ebpf.Map{m}, tables: []*table{newTable("t", &syncpb.TableSchema{KeySize: 8, ValueSize: 4})}}
			if _, err := e.apply(tc.recs); err != nil {
				t.Fatal(err)
			}
			for k, want := range tc.want {
				got := make([]byte, 4)
				err := m.Lookup(k, got)
				switch {
				case want == nil && !errors.Is(err, ebpf.ErrKeyNotExist):
					t.Errorf("key %d: %x (%v), want it deleted", k, got, err)
				case want != nil && (err != nil || !bytes.Equal(got, want)):
					t.Errorf("key %d: %x (%v), want %x", k, got, err, want)
				}
			}
		})
	}
}
