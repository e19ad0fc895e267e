package statesync

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/testutil"
)

// TestBatchReader: the batched lookup reads what BPF_MAP_LOOKUP_ELEM
// reads, for the map types a synced map may be, present and absent keys,
// and more keys than one run takes.
func TestBatchReader(t *testing.T) {
	testutil.RequireRoot(t)
	cases := []struct {
		name    string
		typ     ebpf.MapType
		flags   uint32
		keySize uint32
		valSize uint32
		entries uint32
	}{
		{"hash", ebpf.Hash, 0, 8, 48, 1 << 16},
		{"hash without prealloc", ebpf.Hash, 1 /* BPF_F_NO_PREALLOC */, 16, 8, 1 << 16},
		{"lru hash", ebpf.LRUHash, 0, 13, 24, 1 << 16},
		{"array", ebpf.Array, 0, 4, 64, 1 << 15},
		{"largest key and value", ebpf.Hash, 0, uint32(lookupMaxKey), uint32(lookupMaxValue), 1 << 12},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := ebpf.NewMap(&ebpf.MapSpec{Type: tc.typ, Flags: tc.flags, KeySize: tc.keySize, ValueSize: tc.valSize, MaxEntries: tc.entries})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			r, err := newBatchReader(m)
			if err != nil {
				t.Fatalf("the batched lookup does not load: %v", err)
			}
			defer r.close()
			// Every third key written; more keys asked than one run reads.
			n := min(int(tc.entries), 3*int(r.cfg.Max)+7)
			keys := make([][]byte, n)
			for i := range keys {
				k := make([]byte, tc.keySize)
				binary.LittleEndian.PutUint32(k, uint32(i))
				if tc.keySize > 4 {
					k[tc.keySize-1] = byte(i) ^ 0x5a
				}
				keys[i] = k
				if i%3 == 0 && tc.typ != ebpf.Array {
					v := bytes.Repeat([]byte{byte(i)}, int(tc.valSize))
					binary.LittleEndian.PutUint32(v, uint32(i)*7)
					if err := m.Put(k, v); err != nil {
						t.Fatal(err)
					}
				}
			}
			if tc.typ == ebpf.Array {
				v := bytes.Repeat([]byte{9}, int(tc.valSize))
				if err := m.Put(keys[5], v); err != nil {
					t.Fatal(err)
				}
				keys = append(keys, binary.LittleEndian.AppendUint32(nil, tc.entries+1)) // out of range: absent
			}
			got := map[int][]byte{}
			if err := r.read(keys, func(i int, v []byte) {
				if _, dup := got[i]; dup {
					t.Errorf("key %d handed twice", i)
				}
				got[i] = bytes.Clone(v)
			}); err != nil {
				t.Fatal(err)
			}
			if len(got) != len(keys) {
				t.Fatalf("%d keys handed back of %d", len(got), len(keys))
			}
			want := map[int][]byte{}
			if err := lookupKeys(m, keys, func(i int, v []byte) { want[i] = bytes.Clone(v) }); err != nil {
				t.Fatal(err)
			}
			found := 0
			for i := range keys {
				if !bytes.Equal(got[i], want[i]) || (got[i] == nil) != (want[i] == nil) {
					t.Fatalf("key %d: batched %x, one by one %x", i, got[i], want[i])
				}
				if got[i] != nil {
					found++
				}
			}
			if found == 0 || found == len(keys) {
				t.Fatalf("%d of %d keys found: the case proves nothing", found, len(keys))
			}
		})
	}
}
