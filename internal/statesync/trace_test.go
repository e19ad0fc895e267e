package statesync

import (
	"encoding/binary"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/socklane/socklane/internal/testutil"
)

// wantTracing: the kernel matrix's guests (Debian's kernels) can trace
// the kernel's functions, and must; the host of this project cannot
// (no fentry), and must fall back to reading the map.
func wantTracing() bool { return os.Getenv("SOCKLANE_WANT_TRACING") != "" }

// TestTracer: the tracer of one map records every successful update and
// delete of that map, from user space and from a program, and nothing
// of another map or of a failed write. Where the kernel cannot trace,
// newTracer says so.
func TestTracer(t *testing.T) {
	testutil.RequireRoot(t)
	for _, typ := range []ebpf.MapType{ebpf.Hash, ebpf.LRUHash, ebpf.Array} {
		t.Run(typ.String(), func(t *testing.T) {
			// An LRU map of 64 entries may evict a key before it is full:
			// each CPU takes free entries from the shared list in
			// batches (a delete then finds nothing, 1 run in 30 on 6.1).
			spec := &ebpf.MapSpec{Type: typ, KeySize: 8, ValueSize: 8, MaxEntries: 4096}
			if typ == ebpf.Array {
				spec.KeySize = 4
			}
			m, err := ebpf.NewMap(spec)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			other, err := ebpf.NewMap(spec)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			tr, err := newTracer(m, 7)
			if err != nil {
				if wantTracing() {
					t.Fatalf("this kernel must trace map updates: %v", err)
				}
				t.Logf("no tracing here (the agent reads the map instead): %v", err)
				return
			}
			defer tr.close()
			key := func(k uint32) []byte {
				b := make([]byte, spec.KeySize)
				binary.LittleEndian.PutUint32(b, k)
				return b
			}
			val := make([]byte, 8)
			for _, k := range []uint32{1, 2, 3} {
				if err := m.Put(key(k), val); err != nil {
					t.Fatal(err)
				}
				if err := other.Put(key(k+10), val); err != nil {
					t.Fatal(err)
				}
			}
			want := []uint32{1, 2, 3}
			// A failed write: no record.
			if err := m.Update(key(1), val, ebpf.UpdateNoExist); err == nil {
				t.Fatal("an update with BPF_NOEXIST of a present key succeeded")
			}
			if typ != ebpf.Array {
				if err := m.Delete(key(2)); err != nil {
					t.Fatal(err)
				}
				want = append(want, 2)
			}
			rd, err := ringbuf.NewReader(tr.objs.SlSyncChanges)
			if err != nil {
				t.Fatal(err)
			}
			defer rd.Close()
			var got []uint32
			rd.SetDeadline(time.Now().Add(time.Second))
			for {
				rec, err := rd.Read()
				if errors.Is(err, os.ErrDeadlineExceeded) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				for _, k := range recordKeys(rec.RawSample, 7, int(spec.KeySize), nil) {
					got = append(got, binary.LittleEndian.Uint32(k))
				}
				if len(recordKeys(rec.RawSample, 0, int(spec.KeySize), nil)) != 0 {
					t.Errorf("a record for table 0 in %x", rec.RawSample)
				}
			}
			if len(got) != len(want) {
				t.Fatalf("traced keys %v, want %v", got, want)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("traced keys %v, want %v", got, want)
				}
			}
		})
	}
}

// TestTraceCapture: a synced map whose writer records nothing, read only
// once an hour, replicates as it is written where the kernel's map
// updates can be traced (the capture says "trace"); elsewhere the
// capture says "poll" and why.
func TestTraceCapture(t *testing.T) {
	c := newTestCluster(t, "node-a", "node-b")
	for _, n := range c.nodes {
		c.start(n, func(cfg *Config) { cfg.Tables[0].Changes, cfg.Tables[0].Poll = "", time.Hour })
	}
	c.bootstrapped()
	a := c.nodes[0]
	var st TableStatus
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st = a.engine.Status().Tables[0]
		if st.Capture != "" || time.Now().After(deadline) {
			break
		}
	}
	if st.Capture != CaptureTrace {
		if wantTracing() || st.Capture != CapturePoll || st.CaptureWhy == "" {
			t.Fatalf("capture %q (%s), want trace, or poll with the reason where the kernel cannot trace", st.Capture, st.CaptureWhy)
		}
		t.Logf("capture by reading the map: %s", st.CaptureWhy)
		return
	}
	// Writes by the program, without change records, and from user space.
	for k := range uint64(200) {
		if err := a.churn.Write(k, ChurnVal{Seq: k + 1}, k%5 == 4, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.churn.Map().Put(uint64(1000), ChurnVal{Seq: 1000}); err != nil {
		t.Fatal(err)
	}
	c.converged(10 * time.Second)
	if polls := a.engine.Status().Counters.Polls; polls > 1 {
		t.Errorf("node-a read its map %d times: the writes were not found by tracing", polls)
	}
	if got := a.engine.Status().Counters.Published; got < 161 {
		t.Errorf("node-a published %d changes, want at least the 160 puts and the user-space put", got)
	}
}
