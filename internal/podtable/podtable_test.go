package podtable

import (
	"errors"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"google.golang.org/protobuf/proto"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/policy"
	"github.com/socklane/socklane/internal/syncpb"
	"github.com/socklane/socklane/internal/testutil"
)

func TestEncodeDecode(t *testing.T) {
	long := strings.Repeat("x", 60)
	big := map[string]string{}
	for i := range 30 {
		big[long+string(rune('a'+i))] = long
	}
	for _, c := range []struct {
		name string
		rec  *syncpb.PodRecord
		fail string
	}{
		{"plain", &syncpb.PodRecord{Node: "node-b", Namespace: "y", Name: "b", Labels: map[string]string{"app": "web"},
			Ports: []*syncpb.PodPort{{Name: "http", Port: 80, Protocol: "TCP"}, {Name: "dns", Port: 53, Protocol: "UDP"}}}, ""},
		{"no labels", &syncpb.PodRecord{Node: "n", Namespace: "y", Name: "b"}, ""},
		{"too big", &syncpb.PodRecord{Node: "n", Namespace: "y", Name: "b", Labels: big}, "more than the 1532"},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, err := Encode(c.rec)
			if c.fail != "" {
				if err == nil || !strings.Contains(err.Error(), c.fail) {
					t.Fatalf("Encode: %v, want an error saying %q", err, c.fail)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(v) != ValueSize {
				t.Fatalf("value of %d bytes, want %d", len(v), ValueSize)
			}
			again, _ := Encode(c.rec)
			if string(again) != string(v) {
				t.Error("the same record encoded twice differs")
			}
			got, err := Decode(v)
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, c.rec) {
				t.Errorf("decoded %v, want %v", got, c.rec)
			}
		})
	}
}

func TestDecodeRefuses(t *testing.T) {
	good, err := Encode(&syncpb.PodRecord{Node: "n", Namespace: "y", Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	long := append([]byte(nil), good...)
	long[0], long[1] = 0xff, 0xff
	badPort, _ := Encode(&syncpb.PodRecord{Node: "n", Namespace: "y", Name: "b", Ports: []*syncpb.PodPort{{Name: "p", Port: 70000, Protocol: "TCP"}}})
	sctp, _ := Encode(&syncpb.PodRecord{Node: "n", Namespace: "y", Name: "b", Ports: []*syncpb.PodPort{{Name: "p", Port: 7, Protocol: "SCTP"}}})
	noNode, _ := Encode(&syncpb.PodRecord{Namespace: "y", Name: "b"})
	for name, v := range map[string][]byte{
		"short": good[:10], "length past the data": long, "port out of range": badPort, "SCTP port": sctp, "no node": noNode,
	} {
		if _, err := Decode(v); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// FuzzDecode: no input panics, and what decodes encodes to a value that
// decodes the same.
func FuzzDecode(f *testing.F) {
	v, _ := Encode(&syncpb.PodRecord{Node: "n", Namespace: "y", Name: "b", Labels: map[string]string{"a": "b"},
		Ports: []*syncpb.PodPort{{Name: "http", Port: 80, Protocol: "TCP"}}})
	f.Add(v[:64])
	f.Fuzz(func(t *testing.T, data []byte) {
		v := make([]byte, ValueSize)
		copy(v, data)
		r, err := Decode(v)
		if err != nil {
			return
		}
		again, err := Encode(r)
		if err != nil {
			t.Fatalf("a decoded record does not encode: %v", err)
		}
		r2, err := Decode(again)
		if err != nil || !proto.Equal(r, r2) {
			t.Fatalf("re-encoded record decodes to %v (%v), want %v", r2, err, r)
		}
	})
}

// mapWriter writes straight to the map, as the sync's Publish does (and
// replicates).
type mapWriter struct {
	m      *ebpf.Map
	writes int
}

func (w *mapWriter) Publish(table string, key, value []byte) error {
	if table != datapath.PodTableName {
		return errors.New("wrong table " + table)
	}
	w.writes++
	if value == nil {
		return w.m.Delete(key)
	}
	return w.m.Put(key, value)
}

func newTable(t *testing.T) *ebpf.Map {
	testutil.RequireRoot(t)
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 16, ValueSize: uint32(ValueSize), MaxEntries: 64,
		Flags: 1 /* BPF_F_NO_PREALLOC */})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func pod(ns, name string, labels map[string]string, ips ...string) *policy.Pod {
	p := &policy.Pod{Namespace: ns, Name: name, Labels: labels,
		Ports: []policy.NamedPort{{Name: "http", Port: 8080, Protocol: policy.TCP}}}
	for _, ip := range ips {
		p.IPs = append(p.IPs, netip.MustParseAddr(ip))
	}
	return p
}

// TestPublisher: a node's pods in the table, changes written and nothing
// else, gone pods deleted, an earlier run's leftovers found, another
// node's record of a reused address left alone; Remote reads the other
// nodes' pods with their addresses together.
func TestPublisher(t *testing.T) {
	m := newTable(t)
	a, b := &mapWriter{m: m}, &mapWriter{m: m}
	pa, pb := NewPublisher(a, m, "node-a"), NewPublisher(b, m, "node-b")
	web := pod("x", "web", map[string]string{"app": "web"}, "198.18.1.10", "2001:db8::10")
	db := pod("x", "db", map[string]string{"app": "db"}, "198.18.1.11")
	if res, err := pa.Sync([]*policy.Pod{web, db}); err != nil || res.Put != 3 || res.Deleted != 0 {
		t.Fatalf("first sync: %+v %v, want 3 written", res, err)
	}
	if res, err := pa.Sync([]*policy.Pod{web, db}); err != nil || res.Put+res.Deleted != 0 {
		t.Fatalf("unchanged sync: %+v %v, want nothing written", res, err)
	}
	cli := pod("y", "cli", map[string]string{"app": "cli"}, "198.18.2.20")
	if _, err := pb.Sync([]*policy.Pod{cli}); err != nil {
		t.Fatal(err)
	}
	others, bad, err := Remote(m, "node-b")
	if err != nil || bad != 0 || len(others) != 2 {
		t.Fatalf("node-b's view: %v bad %d %v, want node-a's 2 pods", others, bad, err)
	}
	if others[1].Key() != "x/web" || len(others[1].IPs) != 2 || others[1].Labels["app"] != "web" ||
		len(others[1].Ports) != 1 || others[1].Ports[0].Port != 8080 || others[1].Local() {
		t.Errorf("x/web as node-b sees it: %+v", others[1])
	}
	// web relabelled, db gone.
	web2 := pod("x", "web", map[string]string{"app": "web", "tier": "front"}, "198.18.1.10", "2001:db8::10")
	if res, err := pa.Sync([]*policy.Pod{web2}); err != nil || res.Put != 2 || res.Deleted != 1 {
		t.Fatalf("relabel and delete: %+v %v, want 2 written and 1 deleted", res, err)
	}
	// db's address now node-b's: node-a's next run must not delete it.
	moved := pod("y", "db2", nil, "198.18.1.11")
	if _, err := pb.Sync([]*policy.Pod{cli, moved}); err != nil {
		t.Fatal(err)
	}
	// node-a restarts with web gone: its new publisher finds web's two
	// records and deletes them, and leaves node-b's alone.
	pa2 := NewPublisher(a, m, "node-a")
	if res, err := pa2.Sync(nil); err != nil || res.Deleted != 2 || res.Put != 0 {
		t.Fatalf("restarted node-a with no pods: %+v %v, want its 2 records deleted", res, err)
	}
	mine, _, err := Remote(m, "node-a")
	if err != nil || len(mine) != 2 || mine[0].Key() != "y/cli" || mine[1].Key() != "y/db2" {
		t.Fatalf("left in the table: %v %v, want node-b's y/cli and y/db2", mine, err)
	}
	// A record no node could have written is counted and left out.
	if err := m.Put(Key(netip.MustParseAddr("198.18.9.9")), make([]byte, ValueSize)); err != nil {
		t.Fatal(err)
	}
	if _, bad, _ := Remote(m, "node-a"); bad != 1 {
		t.Errorf("an empty record: %d bad, want 1", bad)
	}
}

// TestPrune: records of a node the cluster no longer lists are deleted
// once it has been missing for NodeGoneGrace, not before, not if it was
// listed again meanwhile, never this node's own, and nothing when the
// cluster lists no node at all.
func TestPrune(t *testing.T) {
	m := newTable(t)
	w := &mapWriter{m: m}
	pa, pb, pc := NewPublisher(w, m, "node-a"), NewPublisher(w, m, "node-b"), NewPublisher(w, m, "node-c")
	for _, step := range []struct {
		p   *Publisher
		pod *policy.Pod
	}{
		{pa, pod("x", "web", nil, "198.18.1.10")},
		{pb, pod("y", "cli", nil, "198.18.2.20", "2001:db8::20")},
		{pc, pod("z", "db", nil, "198.18.3.30")},
	} {
		if _, err := step.p.Sync([]*policy.Pod{step.pod}); err != nil {
			t.Fatal(err)
		}
	}
	listed := map[string]bool{"node-b": true}
	live := func(n string) bool { return listed[n] }
	t0 := time.Unix(1000, 0)
	nodesOf := func() map[string]int {
		recs, _, err := Read(m)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		for _, r := range recs {
			out[r.Node]++
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		after time.Duration
		list  []string // nodes listed, node-b always
		none  bool     // the cluster lists no node
		gone  []string
		left  map[string]int
	}{
		{name: "first seen missing", gone: nil, left: map[string]int{"node-a": 1, "node-b": 2, "node-c": 1}},
		{name: "within the grace", after: NodeGoneGrace / 2, gone: nil, left: map[string]int{"node-a": 1, "node-b": 2, "node-c": 1}},
		{name: "node-c listed again", after: NodeGoneGrace * 3 / 4, list: []string{"node-c"}, gone: nil, left: map[string]int{"node-a": 1, "node-b": 2, "node-c": 1}},
		{name: "no node listed at all", after: 2 * NodeGoneGrace, none: true, gone: nil, left: map[string]int{"node-a": 1, "node-b": 2, "node-c": 1}},
		{name: "node-c missing again: its grace starts over", after: 2*NodeGoneGrace + time.Second, gone: nil, left: map[string]int{"node-a": 1, "node-b": 2, "node-c": 1}},
		{name: "past the grace: this node's own records stay", after: 3*NodeGoneGrace + 2*time.Second, gone: []string{"node-c"}, left: map[string]int{"node-a": 1, "node-b": 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			listed = map[string]bool{"node-b": true}
			for _, n := range tc.list {
				listed[n] = true
			}
			count := len(listed)
			if tc.none {
				count = 0
			}
			gone, err := pa.Prune(live, count, t0.Add(tc.after))
			if err != nil || !slices.Equal(gone, tc.gone) {
				t.Fatalf("prune: %v %v, want %v gone", gone, err, tc.gone)
			}
			if got := nodesOf(); !maps.Equal(got, tc.left) {
				t.Errorf("records by node: %v, want %v", got, tc.left)
			}
		})
	}
}
