package statesync

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/testutil"
)

// record encodes one change record as sl_sync.h writes it (padded to 8).
func record(table uint32, key []byte) []byte {
	b := binary.NativeEndian.AppendUint32(nil, table)
	b = binary.NativeEndian.AppendUint32(b, uint32(len(key)))
	b = append(b, key...)
	for len(b)%8 != 0 {
		b = append(b, 0)
	}
	return b
}

func TestRecordKeys(t *testing.T) {
	k8 := func(v byte) []byte { return bytes.Repeat([]byte{v}, 8) }
	cases := []struct {
		name string
		raw  []byte
		want [][]byte
	}{
		{"one", record(0, k8(1)), [][]byte{k8(1)}},
		{"back to back, another table between", slicesConcat(record(0, k8(1)), record(1, k8(2)), record(0, k8(3))), [][]byte{k8(1), k8(3)}},
		{"padded odd key of another size skipped", slicesConcat(record(0, []byte{9, 9, 9}), record(0, k8(4))), [][]byte{k8(4)}},
		{"truncated last record", slicesConcat(record(0, k8(5)), record(0, k8(6))[:12]), [][]byte{k8(5)}},
		{"key length past the limit", slicesConcat(binary.NativeEndian.AppendUint32(binary.NativeEndian.AppendUint32(nil, 0), 1<<20), k8(7)), nil},
		{"empty", nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := recordKeys(tc.raw, 0, 8, nil)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func slicesConcat(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

// TestStageReader: a CPU's stage is handed out when it moved (another
// append, even with the same bytes: the same key staged again after a
// write-out; or other bytes with the same count: a record caught while
// being written), and not when it is as it was.
func TestStageReader(t *testing.T) {
	testutil.RequireRoot(t)
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: uint32(binary.Size(churnSlSyncStage{})), MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	stage := func(appends uint64, recs ...[]byte) {
		t.Helper()
		vals := make([]churnSlSyncStage, cpus)
		raw := slicesConcat(recs...)
		vals[0].Len, vals[0].Appends = uint32(len(raw)), appends
		copy(vals[0].Records[:], raw)
		if err := m.Put(uint32(0), vals); err != nil {
			t.Fatal(err)
		}
	}
	r := &stageReader{m: m}
	steps := []struct {
		name    string
		appends uint64
		keys    [][]byte
		handed  bool
	}{
		{"a first record", 1, [][]byte{{1, 1, 1, 1, 1, 1, 1, 1}}, true},
		{"as it was", 1, [][]byte{{1, 1, 1, 1, 1, 1, 1, 1}}, false},
		{"the same key staged again after a write-out", 2, [][]byte{{1, 1, 1, 1, 1, 1, 1, 1}}, true},
		{"other bytes, same count", 2, [][]byte{{2, 2, 2, 2, 2, 2, 2, 2}}, true},
		{"a second record", 3, [][]byte{{2, 2, 2, 2, 2, 2, 2, 2}, {3, 3, 3, 3, 3, 3, 3, 3}}, true},
		{"as it was again", 3, [][]byte{{2, 2, 2, 2, 2, 2, 2, 2}, {3, 3, 3, 3, 3, 3, 3, 3}}, false},
	}
	for _, st := range steps {
		var recs [][]byte
		for _, k := range st.keys {
			recs = append(recs, record(0, k))
		}
		stage(st.appends, recs...)
		var got [][]byte
		if err := r.read(func(raw []byte) { got = recordKeys(raw, 0, 8, got) }); err != nil {
			t.Fatal(err)
		}
		want := [][]byte(nil)
		if st.handed {
			want = st.keys
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: handed %v, want %v", st.name, got, want)
		}
	}
}

// TestStagedWriteReplicates: one write, which stays in its CPU's stage
// (the stage is written to the ring only when nearly full), reaches the
// peer, and so does a second write of the same key.
func TestStagedWriteReplicates(t *testing.T) {
	c := newTestCluster(t, "node-a", "node-b")
	for _, n := range c.nodes {
		c.start(n, nil)
	}
	c.bootstrapped()
	a, b := c.nodes[0], c.nodes[1]
	for i, seq := range []uint64{41, 42} {
		if err := a.churn.Write(777, ChurnVal{Seq: seq}, false, true); err != nil {
			t.Fatal(err)
		}
		staged := 0
		var vals []churnSlSyncStage
		if err := a.churn.objs.SlSyncStages.Lookup(uint32(0), &vals); err != nil {
			t.Fatal(err)
		}
		for _, v := range vals {
			staged += int(v.Len)
		}
		if staged == 0 {
			t.Fatalf("write %d: nothing staged (the test is of a record that waits in its stage)", i)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			var got ChurnVal
			err := b.churn.Map().Lookup(uint64(777), &got)
			if err == nil && got.Seq == seq {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("write %d (seq %d) not on node-b after 5 s: %+v (%v)", i, seq, got, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// TestRecordsWithoutStages: a writer whose stages are not pinned would
// leave staged records unseen; the agent refuses its records and reads
// the map instead, and the nodes converge.
func TestRecordsWithoutStages(t *testing.T) {
	c := newTestCluster(t, "node-a", "node-b")
	if err := c.nodes[0].churn.objs.SlSyncStages.Unpin(); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.nodes {
		c.start(n, nil)
	}
	c.bootstrapped()
	for i := range 3 {
		if err := c.nodes[0].churn.Write(uint64(100+i), ChurnVal{Seq: uint64(i)}, false, true); err != nil {
			t.Fatal(err)
		}
	}
	c.converged(10 * time.Second)
	if polls := c.nodes[0].engine.Status().Counters.Polls; polls < 2 {
		t.Fatalf("node-a read its map %d times: it should read it every poll without its stages", polls)
	}
}
