package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/cri"
	"github.com/socklane/socklane/internal/testbed"
	"github.com/socklane/socklane/internal/testutil"
)

// TestPortsRedis: two unmodified redis-server --port 3000 side by side in
// the node's network namespace (one workload named by its cgroup, the
// other by a process), each reached by its own redis-cli -p 3000 (and a
// client elsewhere by the route), their data apart.
func TestPortsRedis(t *testing.T) {
	server := testutil.RequireCommand(t, "redis-server")
	cli := testutil.RequireCommand(t, "redis-cli")
	pb := newPortBed(t)
	// redis-b is named by a process of its cgroup.
	holder := start(t, pb.b, pb.in.Bin, "peer", "pause")
	pb.apply(t, fmt.Sprintf(`workloads:
  - name: redis-a
    cgroup: %%A
    ports: [{port: 3000}]
    pool: 21300-21309
  - name: redis-b
    pid: %d
    ports: [{port: 3000}]
    pool: 21300-21309
routes:
  - {port: 3000, to: redis-b}
`, holder.cmd.Process.Pid))
	for _, p := range []*testbed.Pod{pb.a, pb.b} {
		start(t, p, server, "--port", "3000", "--save", "", "--appendonly", "no", "--dir", t.TempDir(), "--daemonize", "no")
	}
	redis := func(p *testbed.Pod, args ...string) string {
		return strings.TrimSpace(run(t, p, 10*time.Second, cli, append([]string{"-p", "3000"}, args...)...))
	}
	for _, p := range []*testbed.Pod{pb.a, pb.b} {
		ok := false
		for i := 0; i < 100 && !ok; i++ {
			cmd, _ := p.Command(cli, "-p", "3000", "ping")
			out, _ := cmd.Output()
			ok = strings.TrimSpace(string(out)) == "PONG"
			if !ok {
				time.Sleep(100 * time.Millisecond)
			}
		}
		if !ok {
			t.Fatalf("redis in %s never answered", p.Name)
		}
	}
	// TCP only: no program runs for UDP datagrams of the workloads.
	for at, want := range map[ebpf.AttachType]int{ebpf.AttachCGroupInet4Bind: 1, ebpf.AttachCGroupInet4Connect: 1, ebpf.AttachCGroupUDP4Sendmsg: 0, ebpf.AttachCGroupUDP6Recvmsg: 0} {
		if n := testutil.AttachedCount(t, pb.a.Cgroup, at); n != want {
			t.Errorf("%d programs at %s on redis-a's cgroup, want %d", n, at, want)
		}
	}
	if got := redis(pb.a, "set", "who", "a"); got != "OK" {
		t.Fatalf("set in a: %q", got)
	}
	if got := redis(pb.b, "set", "who", "b"); got != "OK" {
		t.Fatalf("set in b: %q", got)
	}
	for _, tc := range []struct {
		from *testbed.Pod
		want string
	}{{pb.a, "a"}, {pb.b, "b"}, {pb.c, "b"}} {
		if got := redis(tc.from, "get", "who"); got != tc.want {
			t.Errorf("get from %s: %q, want %q", tc.from.Name, got, tc.want)
		}
	}
	// Redis reports the port it listens on as 3000 (getsockname), while
	// the kernel has it on two distinct real ports.
	if got := redis(pb.a, "config", "get", "port"); !strings.Contains(got, "3000") {
		t.Errorf("redis-a's port: %q", got)
	}
	l := pb.list(t)
	ra, na := l.real("redis-a", "TCP", 3000)
	rb, _ := l.real("redis-b", "TCP", 3000)
	if ra == 0 || rb == 0 || ra == rb || !listeningOn(t, ra) || !listeningOn(t, rb) || listeningOn(t, 3000) {
		t.Errorf("real ports %d, %d (redis-a's held by %d sockets); want two distinct listened ones, nothing on 3000", ra, rb, na)
	}
	if na != 2 {
		t.Errorf("redis-a's real port held by %d sockets; want 2 (its IPv4 and IPv6 listeners)", na)
	}
}

// TestPortsBoundBefore: a program that bound its port before the rule
// existed keeps it (getsockname and the kernel agree) and stays
// reachable on it from its workload (it is the workload's binding) and
// elsewhere; a copy started after the rule gets a real port of the pool.
// A copy that is not listening is refused to its clients (and a route's),
// never left to whoever holds the port itself: another pod listening there
// catches nothing.
func TestPortsBoundBefore(t *testing.T) {
	pb := newPortBed(t)
	early, _ := pb.bindShow(t, pb.a, "early", "tcp4:127.0.0.1:3004")
	mustBind(t, early, "127.0.0.1:3004")
	thief, _ := pb.bindShow(t, pb.c, "thief", "tcp4:127.0.0.1:3006")
	mustBind(t, thief, "127.0.0.1:3006")
	pb.apply(t, `workloads:
  - name: wa
    cgroup: %A
    ports: [{port: 3004}, {port: 3006}]
    pool: 21400-21409
routes:
  - {port: 3006, to: wa}
`)
	if !listeningOn(t, 3004) {
		t.Fatal("the early program no longer listens on 3004")
	}
	for _, from := range []*testbed.Pod{pb.a, pb.c} {
		if r := probeFrom(t, pb.in, from, "tcp", "127.0.0.1:3004", 2); r.Replies["early 3004"] != 2 {
			t.Errorf("from %s: %v; want the early program", from.Name, r.Replies)
		}
		if r := probeFrom(t, pb.in, from, "tcp", "127.0.0.1:3006", 2); r.Errors["ECONNREFUSED"] != 2 || len(r.Replies) != 0 {
			t.Errorf("from %s to wa's 3006 (no copy listening, another pod on the port itself): %v %v; want ECONNREFUSED", from.Name, r.Replies, r.Errors)
		}
	}
	if c := pb.list(t).Counters["wa"]; c["connects"] < 2 || c["not_bound"] < 4 {
		t.Errorf("wa's counters %v: want its connects to its early program counted, and the refused ones as not_bound", c)
	}
	late, _ := pb.bindShow(t, pb.a, "late", "tcp4:127.0.0.1:3004")
	mustBind(t, late, ":3004")
	if r, _ := pb.list(t).real("wa", "TCP", 3004); r < 21400 || r > 21409 {
		t.Errorf("the late copy's real port %d; want one of 21400-21409", r)
	}
	if r := probeFrom(t, pb.in, pb.a, "tcp", "127.0.0.1:3004", 2); r.Replies["late 3004"] != 2 {
		t.Errorf("wa's client after the late bind: %v; want its own copy (the one it holds)", r.Replies)
	}
}

// TestPortsBypassed: connections that reach a copy through its virtual
// port (its own client, and one elsewhere by the route) are ordinary
// node-local TCP and join the bypass; the bytes arrive whole.
func TestPortsBypassed(t *testing.T) {
	server := testutil.RequireCommand(t, "redis-server")
	cli := testutil.RequireCommand(t, "redis-cli")
	// redis-cli reads in blocking mode: bypassed whatever the kernel.
	pb := newPortBed(t, "--blocking-sockets", "bypass")
	pb.in.Attach(pb.a)
	pb.apply(t, `workloads:
  - name: wa
    cgroup: %A
    ports: [{port: 3000}]
    pool: 21600-21609
routes:
  - {port: 3000, to: wa}
`)
	start(t, pb.a, server, "--port", "3000", "--save", "", "--appendonly", "no", "--dir", t.TempDir(), "--daemonize", "no")
	waitFor(t, func() bool {
		cmd, _ := pb.a.Command(cli, "-p", "3000", "ping")
		out, _ := cmd.Output()
		return strings.TrimSpace(string(out)) == "PONG"
	})
	before := pb.in.Counters()
	value := strings.Repeat("0123456789abcdef", 4096) // 64 KiB
	for _, from := range []*testbed.Pod{pb.a, pb.c} {
		key := "k-" + from.Name
		if got := strings.TrimSpace(run(t, from, 10*time.Second, cli, "-p", "3000", "set", key, value)); got != "OK" {
			t.Fatalf("set from %s: %q", from.Name, got)
		}
		if got := strings.TrimSpace(run(t, from, 10*time.Second, cli, "-p", "3000", "get", key)); got != value {
			t.Errorf("get from %s: %d bytes back, want the %d set", from.Name, len(got), len(value))
		}
	}
	d := testutil.Delta(before, pb.in.Counters())
	mustAtLeast(t, d, "conns_bypassed", 4)
	mustCarry(t, d, 2*uint64(len(value)))
	if c := pb.list(t).Counters["wa"]; c["connects"] < 2 || c["routed"] < 2 {
		t.Errorf("wa's counters %v: want the connects through its virtual port counted", c)
	}
}

// TestPortsCRIPods: workloads named by pod (through the container
// runtime's CRI) and by label selector: each pod's program binds 3000 and
// sees 3000, gets a real port of the shared pool unique on the node, and
// its own client reaches it.
func TestPortsCRIPods(t *testing.T) {
	rt := testutil.StartContainerd(t)
	pb := newPortBed(t)
	rt.RunPod("default", "copy-a", map[string]string{"app": "copy-a"}, testutil.ContainerSpec{Name: "app", Args: []string{"peer", "pause"}})
	rt.RunPod("default", "copy-b", map[string]string{"app": "copy-b", "tier": "x"}, testutil.ContainerSpec{Name: "app", Args: []string{"peer", "pause"}})
	pods := criPods(t, rt)
	a, b := pods["default/copy-a"], pods["default/copy-b"]
	file := pb.rules(t, `workloads:
  - name: by-pod
    pod: default/copy-a
    container: app
    ports: [{port: 3000}]
    pool: 21700-21701
  - name: by-selector
    selector: app=copy-b,tier=x
    ports: [{port: 3000}]
    pool: 21700-21701
`)
	pb.in.MustRun("ports", "apply", "-f", file, "--cri-socket", rt.Socket)
	type served struct {
		out string
		err error
	}
	done := map[string]chan served{}
	for name, p := range map[string]cri.Pod{"a": a, "b": b} {
		ch := make(chan served, 1)
		done[name] = ch
		go func() {
			out, err := rt.Exec(p.Containers[0].ID, 30*time.Second, "/socklane", "peer", "bindshow", "--label", name, "--for", "8s", "tcp4:0.0.0.0:3000")
			ch <- served{out, err}
		}()
	}
	var l portList
	waitFor(t, func() bool {
		l = pb.list(t)
		ra, _ := l.real("by-pod", "TCP", 3000)
		rb, _ := l.real("by-selector", "TCP", 3000)
		return ra != 0 && rb != 0
	})
	ra, _ := l.real("by-pod", "TCP", 3000)
	rb, _ := l.real("by-selector", "TCP", 3000)
	if ra == rb || ra < 21700 || ra > 21701 || rb < 21700 || rb > 21701 {
		t.Errorf("real ports %d and %d: want the two ports of the shared pool", ra, rb)
	}
	for name, p := range map[string]cri.Pod{"a": a, "b": b} {
		out, err := rt.Exec(p.Containers[0].ID, 20*time.Second, "/socklane", "peer", "lbprobe", "127.0.0.1:3000", "--count", "3")
		if err != nil || !strings.Contains(out, fmt.Sprintf(`"%s 3000":3`, name)) || !strings.Contains(out, `"peer_mismatch":0`) {
			t.Errorf("pod %s's own client: %v: %s", name, err, out)
		}
	}
	for name, ch := range done {
		s := <-ch
		if s.err != nil || !strings.Contains(s.out, `"sockname":"0.0.0.0:3000"`) {
			t.Errorf("bindshow in pod %s: %v: %s", name, s.err, s.out)
		}
	}
}
