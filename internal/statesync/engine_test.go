package statesync

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/bpffs"
	"github.com/socklane/socklane/internal/syncpb"
	"github.com/socklane/socklane/internal/testutil"
)

// testNode is one node of an in-process cluster: a churn writer with its
// pinned map and an engine syncing it.
type testNode struct {
	name   string
	addr   string
	churn  *Churn
	engine *Engine
	cancel context.CancelFunc
	done   chan error
}

type testCluster struct {
	t     testing.TB
	dir   string
	certs string
	nodes []*testNode
}

func newTestCluster(t testing.TB, names ...string) *testCluster {
	t.Helper()
	testutil.RequireRoot(t)
	if err := bpffs.Ensure(bpffs.DefaultPath); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(bpffs.DefaultPath, "sl-synctest-")
	if err != nil {
		t.Fatal(err)
	}
	c := &testCluster{t: t, dir: dir, certs: t.TempDir()}
	if err := MakeCerts(c.certs, names, time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		ch, err := OpenChurn(filepath.Join(dir, n), 0)
		if err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, &testNode{name: n, addr: testutil.FreeAddr(t), churn: ch})
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.stop()
			if err := n.churn.Unpin(); err != nil {
				t.Log(err)
			}
			n.churn.Close()
		}
		os.RemoveAll(dir)
	})
	return c
}

func (c *testCluster) config(n *testNode) Config {
	cfg := Config{
		Node: n.name, Listen: n.addr,
		TLS:              TLSFiles{CA: filepath.Join(c.certs, "ca.pem"), Cert: filepath.Join(c.certs, n.name+".pem"), Key: filepath.Join(c.certs, n.name+"-key.pem")},
		Tables:           []TableConfig{{Name: "flows", Path: filepath.Join(n.churn.Dir, ChurnMapName()), Mode: syncpb.Mode_MODE_SHARED, Changes: n.churn.Dir, Poll: 50 * time.Millisecond}},
		DigestInterval:   200 * time.Millisecond,
		BootstrapTimeout: 2 * time.Second,
	}
	for _, o := range c.nodes {
		if o != n {
			cfg.Peers = append(cfg.Peers, Peer{Name: o.name, Address: o.addr})
		}
	}
	return cfg
}

func (c *testCluster) start(n *testNode, mod func(*Config)) {
	c.t.Helper()
	cfg := c.config(n)
	if mod != nil {
		mod(&cfg)
	}
	log := slog.New(slog.NewTextHandler(testWriter{c.t, n.name}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e, err := New(cfg, log)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.engine, n.cancel, n.done = e, cancel, make(chan error, 1)
	go func() { n.done <- e.Run(ctx) }()
}

func (n *testNode) stop() {
	if n.cancel == nil {
		return
	}
	n.cancel()
	if err := <-n.done; err != nil {
		n.engine.log.Error("run", "err", err)
	}
	n.engine.Close()
	n.cancel = nil
}

type testWriter struct {
	t    testing.TB
	node string
}

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s: %s", w.node, bytes.TrimSpace(p))
	return len(p), nil
}

// churnAll writes n random puts and deletes on every node (keys in a
// range shared by all, so that writes to one key from two nodes race).
func (c *testCluster) churnAll(rng *rand.Rand, n int, keys uint64) {
	c.t.Helper()
	for i := range n {
		node := c.nodes[rng.IntN(len(c.nodes))]
		key := rng.Uint64N(keys)
		del := rng.IntN(4) == 0
		val := ChurnVal{Seq: uint64(i)}
		val.Src[0] = rng.Uint32()
		if err := node.churn.Write(key, val, del, true); err != nil {
			c.t.Fatal(err)
		}
	}
}

// converged waits until every node's map holds the same entries.
func (c *testCluster) converged(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	var diff string
	for time.Now().Before(deadline) {
		diff = c.compare()
		if diff == "" {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, n := range c.nodes {
		if n.engine != nil {
			c.t.Logf("%s: %+v", n.name, n.engine.Status())
		}
	}
	c.t.Fatalf("maps differ after %s: %s", timeout, diff)
}

// bootstrapped waits until every running node has its peers' state.
func (c *testCluster) bootstrapped() {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, n := range c.nodes {
		for n.engine != nil && !n.engine.Status().Bootstrapped {
			if time.Now().After(deadline) {
				c.t.Fatalf("%s: not bootstrapped after 10s: %+v", n.name, n.engine.Status())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func (c *testCluster) compare() string {
	var ref map[string][]byte
	for i, n := range c.nodes {
		dump, err := readMap(n.churn.Map())
		if err != nil {
			c.t.Fatal(err)
		}
		if i == 0 {
			ref = dump
			continue
		}
		if len(dump) != len(ref) {
			return fmt.Sprintf("%s holds %d entries, %s %d", n.name, len(dump), c.nodes[0].name, len(ref))
		}
		for k, v := range ref {
			if !bytes.Equal(dump[k], v) {
				return fmt.Sprintf("key %x: %s holds %x, %s %x", k, c.nodes[0].name, v, n.name, dump[k])
			}
		}
	}
	return ""
}

func TestConverge(t *testing.T) {
	c := newTestCluster(t, "node-a", "node-b", "node-c")
	for _, n := range c.nodes {
		c.start(n, nil)
	}
	c.bootstrapped()
	rng := rand.New(rand.NewPCG(1, 2))
	c.churnAll(rng, 5000, 2000)
	// User-space writes too.
	for i := range 200 {
		n := c.nodes[i%3]
		var v ChurnVal
		v.Seq = uint64(1_000_000 + i)
		b := make([]byte, 8)
		b[0] = byte(i)
		b[7] = 0x80
		if err := n.engine.Publish("flows", b, churnBytes(v)); err != nil {
			t.Fatal(err)
		}
	}
	c.converged(10 * time.Second)
	if m := c.nodes[0].churn.Map(); mapLen(t, m) == 0 {
		t.Fatal("nothing was synced")
	}
	for _, n := range c.nodes {
		st := n.engine.Status()
		t.Logf("%s: %d entries, counters %+v", n.name, mapLen(t, n.churn.Map()), st.Counters)
		if st.Counters.Published == 0 || st.Counters.Applied == 0 {
			t.Errorf("%s published %d, applied %d", n.name, st.Counters.Published, st.Counters.Applied)
		}
	}
}

func churnBytes(v ChurnVal) []byte {
	b, err := binary.Append(nil, binary.NativeEndian, v)
	if err != nil {
		panic(err)
	}
	return b
}

func mapLen(t testing.TB, m *ebpf.Map) int {
	t.Helper()
	d, err := readMap(m)
	if err != nil {
		t.Fatal(err)
	}
	return len(d)
}

func TestRingOverflow(t *testing.T) {
	c := newTestCluster(t, "node-a", "node-b")
	// One page of change records: a burst of writes loses most of them.
	small, err := OpenChurn(filepath.Join(c.dir, "small"), 4096)
	if err != nil {
		t.Fatal(err)
	}
	c.nodes[0].churn.Close()
	if err := c.nodes[0].churn.Unpin(); err != nil {
		t.Fatal(err)
	}
	c.nodes[0].churn = small
	for _, n := range c.nodes {
		c.start(n, nil)
	}
	c.bootstrapped()
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 3000 {
		if err := small.Write(rng.Uint64N(5000), ChurnVal{Seq: uint64(i)}, false, true); err != nil {
			t.Fatal(err)
		}
	}
	c.converged(10 * time.Second)
	st := c.nodes[0].engine.Status()
	if st.Counters.LostRecords == 0 {
		t.Fatalf("no change record was lost (the test needs a ring that overflows): %+v", st.Counters)
	}
	t.Logf("lost %d records, %d polls", st.Counters.LostRecords, st.Counters.Polls)
	requireEvent(t, c.nodes[0].engine, EventRecordsLost, "flows", "change records lost")
}

// requireEvent fails unless the engine noted an event of kind (and
// table, if not "") whose detail says want.
func requireEvent(t *testing.T, e *Engine, kind EventKind, table, want string) {
	t.Helper()
	evs := e.Events(context.Background(), 0, false)
	for _, ev := range evs {
		if ev.Kind == kind && (table == "" || ev.Table == table) && strings.Contains(ev.Detail, want) {
			return
		}
	}
	t.Fatalf("no %s event (table %q) saying %q among %v", kind, table, want, evs)
}

func TestRestartEmpty(t *testing.T) {
	c := newTestCluster(t, "node-a", "node-b", "node-c")
	for _, n := range c.nodes {
		c.start(n, nil)
	}
	c.bootstrapped()
	rng := rand.New(rand.NewPCG(5, 6))
	c.churnAll(rng, 3000, 1000)
	c.converged(10 * time.Second)
	// node-c goes away and comes back with an empty map; meanwhile the
	// others write.
	gone := c.nodes[2]
	gone.stop()
	dump, err := readMap(gone.churn.Map())
	if err != nil {
		t.Fatal(err)
	}
	for k := range dump {
		if err := gone.churn.Map().Delete([]byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	live := &testCluster{t: t, nodes: c.nodes[:2]}
	live.churnAll(rng, 2000, 1000)
	c.start(gone, nil)
	c.bootstrapped()
	c.converged(10 * time.Second)
	if n := mapLen(t, gone.churn.Map()); n == 0 {
		t.Fatal("the restarted node got nothing")
	}
	// One snapshot may be enough: it says how far its sender had applied
	// the other peer, which then resends only what came after.
	if n := gone.engine.Status().Counters.SnapshotsApplied; n < 1 || n > 2 {
		t.Errorf("the restarted node applied %d snapshots, want one or one from each peer", n)
	}
	// Two snapshots came in at once: neither may strike off what the
	// other brought (the digests would then differ and ask for more).
	time.Sleep(500 * time.Millisecond)
	for _, n := range c.nodes {
		if st := n.engine.Status(); st.Counters.Diverged != 0 || st.Counters.Resyncs != 0 {
			t.Errorf("%s: %d digests diverged, %d resyncs", n.name, st.Counters.Diverged, st.Counters.Resyncs)
		}
	}
}

func TestRefusals(t *testing.T) {
	tests := []struct {
		name string
		mod  func(c *testCluster, cfg *Config)
		want string
	}{
		{"certificate of another CA", func(c *testCluster, cfg *Config) {
			other := t.TempDir()
			if err := MakeCerts(other, []string{"node-b"}, time.Hour); err != nil {
				t.Fatal(err)
			}
			cfg.TLS = TLSFiles{CA: filepath.Join(other, "ca.pem"), Cert: filepath.Join(other, "node-b.pem"), Key: filepath.Join(other, "node-b-key.pem")}
		}, "not signed by the sync CA|TLS handshake"},
		{"another table", func(c *testCluster, cfg *Config) {
			cfg.Tables[0].Name = "other"
		}, "table 0 is"},
		{"another mode", func(c *testCluster, cfg *Config) {
			cfg.Tables[0].Mode = syncpb.Mode_MODE_ACTIVE_STANDBY
		}, "mode"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestCluster(t, "node-a", "node-b")
			c.start(c.nodes[0], nil)
			c.start(c.nodes[1], func(cfg *Config) { tc.mod(c, cfg) })
			if err := c.nodes[1].churn.Write(7, ChurnVal{Seq: 7}, false, true); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				a := c.nodes[0].engine.Status()
				if a.Counters.Refused > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("node-a refused nothing: %+v", a)
				}
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(300 * time.Millisecond)
			if n := mapLen(t, c.nodes[0].churn.Map()); n != 0 {
				t.Fatalf("node-a took %d entries from a refused peer", n)
			}
			// Each side says why, in its status.
			for _, n := range c.nodes {
				for {
					st := n.engine.Status()
					if saysAny(st.Peers[0].Err+" "+st.LastRefusal, tc.want) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s's error %q (last refusal %q) does not say %q", n.name, st.Peers[0].Err, st.LastRefusal, tc.want)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			requireEvent(t, c.nodes[0].engine, EventPeerRefused, "", "refused")
		})
	}
}

// saysAny reports whether s contains one of the |-separated texts.
func saysAny(s, texts string) bool {
	for _, w := range strings.Split(texts, "|") {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

// BenchmarkReplicate: updates written on one node through the BPF writer
// (256 a run) until the other applied them all (for profiling; the
// figures of record come from `socklane bench --measure sync`).
func BenchmarkReplicate(b *testing.B) {
	c := newTestCluster(b, "node-a", "node-b")
	for _, n := range c.nodes {
		c.start(n, func(cfg *Config) { cfg.DigestInterval = time.Second })
	}
	c.bootstrapped()
	a, bn := c.nodes[0], c.nodes[1]
	const count = 1 << 18
	b.ResetTimer()
	for i := range b.N {
		before := bn.engine.Status().Counters.Applied
		for k := 0; k < count; k += ChurnBatch {
			if err := a.churn.WriteRange(uint64(k), ChurnBatch, ChurnVal{Seq: uint64(i)<<32 | uint64(k)}, false, true); err != nil {
				b.Fatal(err)
			}
		}
		for bn.engine.Status().Counters.Applied < before+count {
			time.Sleep(time.Millisecond)
		}
	}
	b.ReportMetric(float64(count*b.N)/b.Elapsed().Seconds(), "updates/s")
	b.Logf("a: %+v", a.engine.Status().Counters)
	b.Logf("b: %+v", bn.engine.Status().Counters)
}

// BenchmarkInitialSync: a node with an empty map joins one holding n
// entries (for profiling; see `socklane bench --measure sync`).
func BenchmarkInitialSync(b *testing.B) {
	const n = 1 << 20
	for range b.N {
		b.StopTimer()
		c := newTestCluster(b, "node-a", "node-b")
		a, bn := c.nodes[0], c.nodes[1]
		keys := make([]uint64, n)
		vals := make([]ChurnVal, n)
		for i := range keys {
			keys[i], vals[i] = uint64(i), ChurnVal{Seq: uint64(i)}
		}
		if _, err := a.churn.Map().BatchUpdate(keys, vals, nil); err != nil {
			b.Fatal(err)
		}
		c.start(a, func(cfg *Config) { cfg.BootstrapTimeout = 10 * time.Millisecond })
		for a.engine.Status().Tables[0].Entries < n {
			time.Sleep(10 * time.Millisecond)
		}
		b.StartTimer()
		c.start(bn, nil)
		for st := bn.engine.Status(); st.Tables[0].Entries < n || !st.Bootstrapped; st = bn.engine.Status() {
			time.Sleep(10 * time.Millisecond)
		}

		b.StopTimer()
		a.stop()
		bn.stop()
		b.StartTimer()
	}
}
