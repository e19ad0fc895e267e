package e2e

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/testbed"
)

// TestPortsSharing: SO_REUSEPORT copies of one workload share its real
// port (the kernel balances between them, as on the port itself); without
// it a second bind fails as on the port itself; SO_REUSEADDR servers
// restart at once; a socket of another workload cannot join a copy's real
// port, even with SO_REUSEPORT and the same user.
func TestPortsSharing(t *testing.T) {
	pb := newPortBed(t)
	pb.apply(t, `workloads:
  - name: wa
    cgroup: %A
    ports: [{port: 3001}]
    pool: 21100-21109
  - name: wb
    cgroup: %B
    ports: [{port: 3001}]
    pool: 21100-21109
`)
	b1, _ := pb.bindShow(t, pb.a, "a1", "--reuseport", "tcp4:0.0.0.0:3001")
	b2, _ := pb.bindShow(t, pb.a, "a2", "--reuseport", "tcp4:0.0.0.0:3001")
	mustBind(t, b1, ":3001")
	mustBind(t, b2, ":3001")
	real, socks := pb.list(t).real("wa", "TCP", 3001)
	if real == 0 || socks != 2 {
		t.Fatalf("wa's SO_REUSEPORT sockets: real port %d held by %d sockets; want one port, 2 sockets", real, socks)
	}
	r := probeFrom(t, pb.in, pb.a, "tcp", "127.0.0.1:3001", 40)
	if r.Replies["a1 3001"] == 0 || r.Replies["a2 3001"] == 0 || r.PeerMismatch != 0 {
		t.Errorf("40 connects to the reuseport group: %v (peer mismatches %d); want both sockets to answer", r.Replies, r.PeerMismatch)
	}
	// Without SO_REUSEPORT: EADDRINUSE, as a second bind of 3001 would.
	b3, _ := pb.bindShow(t, pb.a, "a3", "tcp4:0.0.0.0:3001")
	if b3[0].Error != "EADDRINUSE" {
		t.Errorf("a second bind without SO_REUSEPORT: %+v; want EADDRINUSE", b3[0])
	}
	// A process in a cgroup below the workload's (a container of a pod)
	// is the workload's too: it joins the reuseport group.
	child := filepath.Join(pb.a.Cgroup, "ctr")
	if err := os.Mkdir(child, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(child) })
	b4, _ := pb.bindShow(t, &testbed.Pod{Name: "pta-ctr", Cgroup: child}, "a4", "--reuseport", "tcp4:0.0.0.0:3001")
	mustBind(t, b4, ":3001")
	if r, n := pb.list(t).real("wa", "TCP", 3001); r != real || n != 3 {
		t.Errorf("after a bind from wa's child cgroup: real port %d held by %d sockets; want %d by 3", r, n, real)
	}
	// wb's copy gets a real port of its own from the same pool.
	bb, bbCmd := pb.bindShow(t, pb.b, "b", "tcp4:0.0.0.0:3001")
	mustBind(t, bb, ":3001")
	rb, _ := pb.list(t).real("wb", "TCP", 3001)
	if rb == 0 || rb == real {
		t.Errorf("wb's real port %d; want one of its own (wa holds %d)", rb, real)
	}
	// A server that restarts (SO_REUSEADDR, as Go's) binds again at once:
	// its old real port rests (its connections' TIME_WAIT), another of
	// the pool is drawn.
	if r := probeFrom(t, pb.in, pb.b, "tcp", "127.0.0.1:3001", 3); r.Replies["b 3001"] != 3 {
		t.Fatalf("wb's client: %v", r.Replies)
	}
	stop(bbCmd)
	again, _ := pb.bindShow(t, pb.b, "b-again", "tcp4:0.0.0.0:3001")
	mustBind(t, again, ":3001")
	rb2, _ := pb.list(t).real("wb", "TCP", 3001)
	if rb2 == 0 || rb2 == rb || rb2 == real {
		t.Errorf("wb's restarted copy got real port %d (had %d, wa holds %d): want another free one", rb2, rb, real)
	}
	if r := probeFrom(t, pb.in, pb.b, "tcp", "127.0.0.1:3001", 3); r.Replies["b-again 3001"] != 3 {
		t.Errorf("wb's client after the restart: %v", r.Replies)
	}
	// The attack: wb binds wa's real port itself, with SO_REUSEPORT, as
	// the same user: refused, nothing of wa's traffic reaches it.
	evil, _ := pb.bindShow(t, pb.b, "evil", "--reuseport", fmt.Sprintf("tcp4:0.0.0.0:%d", real))
	if evil[0].Error != "EADDRINUSE" {
		t.Errorf("wb binding wa's real port %d with SO_REUSEPORT: %+v; want EADDRINUSE", real, evil[0])
	}
	if c := pb.list(t).Counters["wb"]; c["foreign_bind"] < 1 {
		t.Errorf("wb's counters %v; want foreign_bind counted", c)
	}
	r = probeFrom(t, pb.in, pb.a, "tcp", "127.0.0.1:3001", 20)
	if r.Replies["evil 3001"] != 0 || r.Replies["a1 3001"]+r.Replies["a2 3001"]+r.Replies["a4 3001"] != 20 {
		t.Errorf("after the attack, wa's clients got %v", r.Replies)
	}
}

// TestPortsPoolLifetime: a pool runs out (EADDRINUSE, counted and
// reported as an event naming the workload, never a collision), a closed
// socket's real port returns to the pool, resting first for
// reuseAfterSeconds (its connections' TIME_WAIT), and binds to port 0
// draw from the pool where a rule says so.
func TestPortsPoolLifetime(t *testing.T) {
	pb := newPortBed(t)
	pb.apply(t, `workloads:
  - name: wa
    cgroup: %A
    ports: [{port: 3002-3003}]
    pool: 21200-21200
    reuseAfterSeconds: 0
  - name: wb
    cgroup: %B
    ports: [{port: 3002}, {port: 0}]
    pool: 21201-21202
`)
	_, events, _ := background(t, pb.in, "reading events", "events", "-o", "json", "--type", "ports_exhausted", "--count", "1", "--duration", "60s")
	evs := make(chan string, 1)
	go func() { b, _ := io.ReadAll(events); evs <- string(b) }()
	first, srv := pb.bindShow(t, pb.a, "a", "tcp4:127.0.0.1:3002")
	mustBind(t, first, ":3002")
	second, _ := pb.bindShow(t, pb.a, "a", "tcp4:127.0.0.1:3003")
	if second[0].Error != "EADDRINUSE" {
		t.Fatalf("a bind with the pool of one port held: %+v; want EADDRINUSE", second[0])
	}
	if c := pb.list(t).Counters["wa"]; c["exhausted"] < 1 {
		t.Errorf("wa's counters %v; want exhausted 1", c)
	}
	select {
	case ev := <-evs:
		if !strings.Contains(ev, `"type":"ports_exhausted"`) || !strings.Contains(ev, `"workload":"wa"`) || !strings.Contains(ev, ":3003") {
			t.Errorf("event %q; want ports_exhausted of wa, virtual port 3003", ev)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("no ports_exhausted event")
	}
	// Closed: the port returns at once (reuseAfterSeconds 0).
	stop(srv)
	waitFor(t, func() bool { r, _ := pb.list(t).real("wa", "TCP", 3002); return r == 0 })
	again, _ := pb.bindShow(t, pb.a, "a", "tcp4:127.0.0.1:3003")
	mustBind(t, again, ":3003")
	if r, _ := pb.list(t).real("wa", "TCP", 3003); r != 21200 {
		t.Errorf("after the close, 3003 got real port %d; want 21200 back", r)
	}
	// wb rests a released port 60 s by default: with both its ports
	// used once, a third bind finds none.
	b1, s1 := pb.bindShow(t, pb.b, "b", "tcp4:127.0.0.1:3002")
	if b1[0].Error != "" {
		out, _ := exec.Command("ss", "-Htlnpa").Output()
		t.Logf("ports: %+v\n%s", pb.list(t), out)
	}
	mustBind(t, b1, ":3002")
	eph, _ := pb.bindShow(t, pb.b, "b", "tcp4:127.0.0.1:0")
	if eph[0].Error != "" || !strings.Contains(eph[0].Sockname, ":2120") {
		t.Errorf("a bind to port 0 in wb: %+v; want a port of its pool 21201-21202", eph[0])
	}
	stop(s1)
	waitFor(t, func() bool { r, _ := pb.list(t).real("wb", "TCP", 3002); return r == 0 })
	b2, _ := pb.bindShow(t, pb.b, "b", "tcp4:127.0.0.1:3002")
	if b2[0].Error != "EADDRINUSE" {
		t.Errorf("a bind while wb's only free port rests: %+v; want EADDRINUSE", b2[0])
	}
	resting := 0
	for _, p := range pb.list(t).Ports {
		if p.Workload == "wb" && p.Resting {
			resting++
		}
	}
	if resting != 1 {
		t.Errorf("wb has %d resting ports; want 1: %+v", resting, pb.list(t).Ports)
	}
}
