package e2e

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/bpffs"
	"github.com/socklane/socklane/internal/statesync"
	"github.com/socklane/socklane/internal/testbed"
	"github.com/socklane/socklane/internal/testutil"
)

// syncNode is one "node": a pod (network namespace over veth) running
// its own datapath instance and agent, with two synced maps: flows,
// written by a BPF program that records its changes, and users, written
// from user space and found by the agent's reads.
type syncNode struct {
	name  string
	pod   *testbed.Pod
	in    *testutil.Instance
	churn *statesync.Churn
	users *ebpf.Map
	addr  string
	cmd   *exec.Cmd
	logs  *lockedBuffer
}

type syncBed struct {
	t     *testing.T
	bed   *testbed.Bed
	certs string
	nodes []*syncNode
	extra []string
	// host: the nodes are cgroups in the host's network namespace on
	// loopback ports (to reach the test's API server); tableOpts are
	// added to every --sync-map; nodeArgs to one node's agent.
	host      bool
	tableOpts string
	nodeArgs  map[string][]string
}

const syncPort = 7400

func newSyncBed(t *testing.T, names ...string) *syncBed {
	t.Helper()
	return newSyncBedOn(t, false, names...)
}

func newSyncBedOn(t *testing.T, host bool, names ...string) *syncBed {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireCommand(t, "iptables")
	b := &syncBed{t: t, bed: testutil.Bed(t), certs: t.TempDir(), host: host, nodeArgs: map[string][]string{}}
	if err := statesync.MakeCerts(b.certs, names, time.Hour); err != nil {
		t.Fatal(err)
	}
	pins, err := os.MkdirTemp(bpffs.DefaultPath, "sl-sync-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pins) })
	for _, name := range names {
		n := &syncNode{name: name, in: testutil.NewInstance(t)}
		if host {
			n.pod, n.addr = testutil.HostPod(t, b.bed, name), testutil.FreeAddr(t)
		} else {
			n.pod = testutil.Pod(t, b.bed, name)
			n.addr = fmt.Sprintf("%s:%d", n.pod.IPv4, syncPort)
		}
		if n.churn, err = statesync.OpenChurn(filepath.Join(pins, name), 0); err != nil {
			t.Fatal(err)
		}
		n.users, err = ebpf.NewMapWithOptions(&ebpf.MapSpec{Name: "users", Type: ebpf.Hash, KeySize: 8, ValueSize: 16, MaxEntries: 65536, Pinning: ebpf.PinByName},
			ebpf.MapOptions{PinPath: n.churn.Dir})
		if err != nil {
			t.Fatal(err)
		}
		b.nodes = append(b.nodes, n)
	}
	t.Cleanup(func() {
		for _, n := range b.nodes {
			b.kill(n)
			_ = n.users.Unpin()
			n.users.Close()
			_ = n.churn.Unpin()
			n.churn.Close()
		}
	})
	return b
}

func (b *syncBed) args(n *syncNode) []string {
	args := []string{"--name", n.in.Name, "agent", "--cgroup", n.pod.Cgroup, "--metrics-address", "",
		"--node-name", n.name, "--sync-listen", n.addr,
		"--sync-map", filepath.Join(n.churn.Dir, statesync.ChurnMapName()) + ",name=flows,changes=" + n.churn.Dir + b.tableOpts,
		"--sync-map", filepath.Join(n.churn.Dir, "users") + ",name=users,poll=100ms" + b.tableOpts,
		"--sync-ca", filepath.Join(b.certs, "ca.pem"),
		"--sync-cert", filepath.Join(b.certs, n.name+".pem"), "--sync-key", filepath.Join(b.certs, n.name+"-key.pem"),
		"--sync-digest-interval", "500ms", "--sync-bootstrap-timeout", "3s",
	}
	for _, o := range b.nodes {
		if o != n {
			args = append(args, "--sync-peer", o.name+"="+o.addr)
		}
	}
	return append(append(append(args, b.extra...), b.nodeArgs[n.name]...), n.in.Settings...)
}

func (b *syncBed) start(n *syncNode) {
	b.t.Helper()
	b.start1(n, b.args(n))
}

// start1 starts a node's agent with these arguments.
func (b *syncBed) start1(n *syncNode, args []string) {
	b.t.Helper()
	cmd, err := n.pod.Command(n.in.Bin, args...)
	if err != nil {
		b.t.Fatal(err)
	}
	n.logs = &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = n.logs, n.logs
	if err := cmd.Start(); err != nil {
		b.t.Fatal(err)
	}
	n.cmd = cmd
}

// kill ends an agent with SIGKILL: nothing of it runs on exit.
func (b *syncBed) kill(n *syncNode) {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Kill()
	_ = n.cmd.Wait()
	n.cmd = nil
}

func (b *syncBed) status(n *syncNode) (statesync.Status, error) {
	var st statesync.Status
	out, err := n.in.Run("sync", "status", "-o", "json")
	if err != nil {
		return st, fmt.Errorf("%v: %s", err, out)
	}
	return st, json.Unmarshal([]byte(out), &st)
}

// requireEvent fails unless `socklane sync events -o json` on n lists
// an event of kind about peer whose detail says want.
func (b *syncBed) requireEvent(n *syncNode, kind statesync.EventKind, peer, want string) {
	b.t.Helper()
	out, err := n.in.Run("sync", "events", "-o", "json")
	if err != nil {
		b.t.Fatalf("socklane sync events: %v: %s", err, out)
	}
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var ev statesync.Event
		if err := dec.Decode(&ev); err != nil {
			b.t.Fatalf("socklane sync events: %v in %s", err, out)
		}
		if ev.Kind == kind && ev.Peer == peer && strings.Contains(ev.Detail, want) {
			return
		}
	}
	b.t.Fatalf("%s: no %s event about %s saying %q in\n%s", n.name, kind, peer, want, out)
}

// bootstrapped waits until every running agent has its peers' state.
func (b *syncBed) bootstrapped() {
	b.t.Helper()
	for _, n := range b.nodes {
		deadline := time.Now().Add(20 * time.Second)
		for {
			st, err := b.status(n)
			if err == nil && st.Bootstrapped {
				break
			}
			if time.Now().After(deadline) {
				b.t.Fatalf("%s not bootstrapped in 20s (%v): %+v\n%s", n.name, err, st, n.logs.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// churn makes count random writes spread over nodes: puts and deletes of
// flows through the BPF program, and of users from user space, on keys
// every node writes.
func (b *syncBed) churn(rng *rand.Rand, nodes []*syncNode, count int, lo, hi uint64) {
	b.t.Helper()
	for i := range count {
		n := nodes[rng.IntN(len(nodes))]
		key := lo + rng.Uint64N(hi-lo)
		del := rng.IntN(4) == 0
		if rng.IntN(5) == 0 {
			var k [8]byte
			binary.LittleEndian.PutUint64(k[:], key)
			var v [16]byte
			binary.LittleEndian.PutUint64(v[:], rng.Uint64())
			var err error
			if del {
				err = n.users.Delete(k[:])
				if err != nil && !isNotExist(err) {
					b.t.Fatal(err)
				}
				continue
			}
			if err = n.users.Put(k[:], v[:]); err != nil {
				b.t.Fatal(err)
			}
			continue
		}
		val := statesync.ChurnVal{Seq: uint64(i)}
		val.Src[0] = rng.Uint32()
		if err := n.churn.Write(key, val, del, true); err != nil {
			b.t.Fatal(err)
		}
	}
}

func isNotExist(err error) bool { return errors.Is(err, ebpf.ErrKeyNotExist) }

// dumps reads both maps of a node.
func (b *syncBed) dumps(n *syncNode) [2]map[string]string {
	b.t.Helper()
	var out [2]map[string]string
	for i, m := range []*ebpf.Map{n.churn.Map(), n.users} {
		out[i] = map[string]string{}
		k := make([]byte, m.KeySize())
		v := make([]byte, m.ValueSize())
		it := m.Iterate()
		for it.Next(&k, &v) {
			out[i][string(k)] = string(v)
		}
		if err := it.Err(); err != nil {
			b.t.Fatal(err)
		}
	}
	return out
}

// converged waits until every node's maps hold the same entries (full
// dumps compared), and says what differs if they never do.
func (b *syncBed) converged(timeout time.Duration) {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	var why string
	for {
		why = ""
		ref := b.dumps(b.nodes[0])
		for _, n := range b.nodes[1:] {
			d := b.dumps(n)
			for i, table := range []string{"flows", "users"} {
				if len(d[i]) != len(ref[i]) {
					why = fmt.Sprintf("%s: %s holds %d entries, %s %d", table, n.name, len(d[i]), b.nodes[0].name, len(ref[i]))
				}
				for k, v := range ref[i] {
					if why == "" && d[i][k] != v {
						why = fmt.Sprintf("%s key %x: %s holds %x, %s %x", table, k, b.nodes[0].name, v, n.name, d[i][k])
					}
				}
			}
		}
		if why == "" {
			if len(ref[0]) == 0 || len(ref[1]) == 0 {
				b.t.Fatal("converged on empty maps: the churn wrote nothing")
			}
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, n := range b.nodes {
		st, err := b.status(n)
		b.t.Logf("%s: %+v %v", n.name, st, err)
	}
	b.t.Fatalf("maps differ after %s: %s", timeout, why)
}

// partition drops every TCP segment of a node (in its own namespace).
func (b *syncBed) partition(n *syncNode, on bool) {
	b.t.Helper()
	op := "-I"
	if !on {
		op = "-D"
	}
	for _, chain := range []string{"INPUT", "OUTPUT"} {
		out, err := exec.Command("nsenter", "--net="+n.pod.NetNS, "iptables", "-w", op, chain, "-p", "tcp", "-j", "DROP").CombinedOutput()
		if err != nil {
			b.t.Fatalf("iptables %s %s: %v: %s", op, chain, err, out)
		}
	}
}

func (b *syncBed) counters(n *syncNode) statesync.Counters {
	b.t.Helper()
	st, err := b.status(n)
	if err != nil {
		b.t.Fatal(err)
	}
	return st.Counters
}

// TestSyncFaults: three nodes replicate two maps (BPF writes with change
// records, user-space writes found by reads) through random churn and
// each fault, and after each every node holds the same entries.
func TestSyncFaults(t *testing.T) {
	b := newSyncBed(t, "node-a", "node-b", "node-c")
	b.extra = []string{"--sync-log-size", "2048"}
	for _, n := range b.nodes {
		b.start(n)
	}
	b.bootstrapped()
	rng := rand.New(rand.NewPCG(7, 8))
	all := b.nodes
	b.churn(rng, all, 4000, 0, 1500)
	b.converged(20 * time.Second)
	a, c := b.nodes[0], b.nodes[2]

	t.Run("partition", func(t *testing.T) {
		// A short partition: the streams stall, the log holds what the
		// others missed, resent once it heals.
		before := b.counters(c)
		b.partition(c, true)
		b.churn(rng, all, 600, 0, 1500)
		time.Sleep(6 * time.Second) // the streams time out (4 s silent)
		b.partition(c, false)
		b.converged(30 * time.Second)
		after := b.counters(c)
		if after.Applied == before.Applied {
			t.Fatal("node-c applied nothing after the partition healed")
		}
		if after.SnapshotsApplied != before.SnapshotsApplied {
			t.Errorf("node-c needed %d snapshots after a partition its peers' logs covered (want the missed changes resent)", after.SnapshotsApplied-before.SnapshotsApplied)
		}
	})
	t.Run("partition past the log", func(t *testing.T) {
		// A long one: more changes than the log holds, so a snapshot.
		// Writes to one key between two reads of the changed keys make
		// one change, so the keys are drawn from a range wide enough
		// that nearly every write is a change of its own: node-a makes
		// about 4500, twice what its log holds, however the reads fall.
		// Only node-a writes, and keys no other node wrote: node-c must
		// get node-a's changes from node-a. Had node-b's log overflowed,
		// or had node-a overwritten keys of node-b's (node-c's digest of
		// node-b's entries then differs, and node-c asks node-b for a
		// snapshot), node-c could take node-a's entries from node-b's
		// snapshot, which says how far node-b had applied node-a; node-a's
		// log then holds the rest and rightly sends no snapshot (seen in
		// CI).
		before := b.counters(a)
		b.partition(c, true)
		b.churn(rng, all[:1], 6000, 1<<20, 2<<20)
		// Longer than the streams' 4 s silence by a margin a loaded
		// machine keeps: a stream still open when the partition heals
		// gets everything from its socket buffers, and no snapshot is
		// needed (seen once with 5 s).
		time.Sleep(9 * time.Second)
		b.partition(c, false)
		b.converged(30 * time.Second)
		// node-a counts the snapshot once its last chunk is sent, which
		// can be just after node-c applied it.
		for deadline := time.Now().Add(5 * time.Second); ; {
			after := b.counters(a)
			if after.SnapshotsSent != before.SnapshotsSent {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node-a sent node-c no snapshot after its log overflowed: %+v", after)
			}
			time.Sleep(100 * time.Millisecond)
		}
		// `socklane sync events` says so, and why.
		b.requireEvent(a, statesync.EventResync, "node-c", "log overflow")
		b.requireEvent(a, statesync.EventSnapshotSent, "node-c", "snapshot sent")
		b.requireEvent(c, statesync.EventSnapshotApplied, "node-a", "snapshot applied")
	})
	t.Run("kill -9 mid-stream", func(t *testing.T) {
		var wg sync.WaitGroup
		stop := make(chan struct{})
		crng := rand.New(rand.NewPCG(9, 10))
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				b.churn(crng, all, 50, 0, 1500)
			}
		})
		time.Sleep(300 * time.Millisecond)
		b.kill(b.nodes[1])
		time.Sleep(time.Second)
		b.start(b.nodes[1])
		time.Sleep(time.Second)
		close(stop)
		wg.Wait()
		b.bootstrapped()
		b.converged(30 * time.Second)
	})
	t.Run("back with an empty map", func(t *testing.T) {
		n := b.nodes[1]
		b.kill(n)
		for _, m := range []*ebpf.Map{n.churn.Map(), n.users} {
			k := make([]byte, m.KeySize())
			var keys [][]byte
			it := m.Iterate()
			v := make([]byte, m.ValueSize())
			for it.Next(&k, &v) {
				keys = append(keys, append([]byte(nil), k...))
			}
			for _, k := range keys {
				if err := m.Delete(k); err != nil {
					t.Fatal(err)
				}
			}
		}
		b.churn(rng, []*syncNode{a, c}, 1000, 0, 1500)
		b.start(n)
		b.bootstrapped()
		b.converged(30 * time.Second)
		// One snapshot can be enough: it says how far its sender had
		// applied the other peer, which then resends only what follows.
		if got := b.counters(n); got.SnapshotsApplied < 1 {
			t.Fatalf("the emptied node applied %d snapshots, want at least one", got.SnapshotsApplied)
		}
	})
}

// TestSyncBadInput: the agent refuses bad sync settings before it
// touches the node: a non-zero exit naming the problem and the fix, and
// no datapath pinned.
func TestSyncBadInput(t *testing.T) {
	b := newSyncBed(t, "node-a")
	n := b.nodes[0]
	perCPU, err := ebpf.NewMapWithOptions(&ebpf.MapSpec{Name: "percpu", Type: ebpf.PerCPUHash, KeySize: 8, ValueSize: 8, MaxEntries: 16, Pinning: ebpf.PinByName},
		ebpf.MapOptions{PinPath: n.churn.Dir})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = perCPU.Unpin(); perCPU.Close() }()
	other := t.TempDir()
	if err := statesync.MakeCerts(other, []string{"node-z"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	mapArg := filepath.Join(n.churn.Dir, statesync.ChurnMapName())
	certs := []string{"--sync-ca", filepath.Join(b.certs, "ca.pem"), "--sync-cert", filepath.Join(b.certs, "node-a.pem"), "--sync-key", filepath.Join(b.certs, "node-a-key.pem")}
	base := func(extra ...string) []string {
		return append([]string{"agent", "--cgroup", n.pod.Cgroup, "--metrics-address", "", "--node-name", "node-a"}, extra...)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"map without listen", base("--sync-map", mapArg), "need --sync-listen"},
		{"two maps, one ring", base(append([]string{"--sync-listen", "127.0.0.1:0", "--sync-map", mapArg + ",changes=" + n.churn.Dir,
			"--sync-map", mapArg + ",name=again,record=1,changes=" + n.churn.Dir}, certs...)...), "one ring buffer per map"},
		{"no such pin", base(append([]string{"--sync-listen", "127.0.0.1:0", "--sync-map", "/sys/fs/bpf/sl-no-such-map"}, certs...)...), "pin it first"},
		{"relative path", base(append([]string{"--sync-listen", "127.0.0.1:0", "--sync-map", "flows"}, certs...)...), "must be absolute"},
		{"bad option", base(append([]string{"--sync-listen", "127.0.0.1:0", "--sync-map", mapArg + ",mode=primary"}, certs...)...), "neither shared nor active-standby"},
		{"per-CPU map", base(append([]string{"--sync-listen", "127.0.0.1:0", "--sync-map", filepath.Join(n.churn.Dir, "percpu")}, certs...)...), "cannot be synced"},
		{"no certificates", base("--sync-listen", "127.0.0.1:0", "--sync-map", mapArg), "mutual TLS"},
		{"another node's certificate", base("--sync-listen", "127.0.0.1:0", "--sync-map", mapArg, "--sync-ca", filepath.Join(other, "ca.pem"),
			"--sync-cert", filepath.Join(other, "node-z.pem"), "--sync-key", filepath.Join(other, "node-z-key.pem")), "not this node node-a"},
		{"peer given twice", base(append([]string{"--sync-listen", "127.0.0.1:0", "--sync-map", mapArg, "--sync-peer", "node-b=127.0.0.1:1", "--sync-peer", "node-b=127.0.0.1:2"}, certs...)...), "given twice"},
		{"lease without active-standby", base(append([]string{"--sync-listen", "127.0.0.1:0", "--sync-map", mapArg, "--sync-lease", "default/pair"}, certs...)...), "no --sync-map has mode=active-standby"},
		{"pods without listen", base("--sync-pods"), "need --sync-listen"},
		{"pods without policies", base(append([]string{"--sync-listen", "127.0.0.1:0", "--sync-pods"}, certs...)...), "it needs --kube-policies"},
		{"pods, bad certificate", base("--sync-listen", "127.0.0.1:0", "--sync-pods", "--kube-policies", "--kube-pod-selector", "app=x",
			"--kubeconfig", "/nonexistent", "--sync-ca", filepath.Join(other, "ca.pem"),
			"--sync-cert", filepath.Join(other, "node-z.pem"), "--sync-key", filepath.Join(other, "node-z-key.pem")), "not this node node-a"},
		{"pods' node grace under a second", base(append([]string{"--sync-listen", "127.0.0.1:0", "--sync-pods", "--kube-policies", "--kube-pod-selector", "app=x",
			"--kubeconfig", "/nonexistent", "--sync-pods-node-grace", "10ms"}, certs...)...), "want at least 1s"},
		{"both peer sources", base(append([]string{"--sync-listen", "127.0.0.1:0", "--sync-map", mapArg, "--sync-peer", "node-b=127.0.0.1:1", "--sync-peers-from", "ns/app=x"}, certs...)...), "give the peers one way"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := n.in.Run(tc.args...)
			if err == nil || !strings.Contains(out, tc.want) {
				t.Fatalf("socklane %v: err %v, output does not say %q:\n%s", tc.args, err, tc.want, out)
			}
			if _, err := os.Stat(filepath.Join(bpffs.DefaultPath, n.in.Name)); err == nil {
				t.Fatalf("a datapath was pinned for instance %s despite the error", n.in.Name)
			}
		})
	}
}
