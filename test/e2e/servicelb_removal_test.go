package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/testbed"
	"github.com/socklane/socklane/internal/testutil"
)

// checkRemoval removes backend gone from the held sockets' service and
// checks that exactly its sockets are destroyed.
func checkRemoval(t *testing.T, holds []*holder, gone string, apply func() map[string]float64) {
	t.Helper()
	var want, kept int
	for _, h := range holds {
		want += len(h.on(gone))
		kept += len(h.backend) - len(h.on(gone))
	}
	if want == 0 || kept == 0 {
		t.Fatalf("the held sockets did not spread over the backends: %v", holds[0].backend)
	}
	r := apply()
	if int(r["sockets_destroyed"]) != want {
		t.Errorf("apply destroyed %v sockets, want %d (report %v)", r["sockets_destroyed"], want, r)
	}
	if r["stale_backends"] < 1 {
		t.Errorf("apply reported no stale backend: %v", r)
	}
	for _, h := range holds {
		closed := h.closed(t, len(h.on(gone)), 500*time.Millisecond)
		for _, i := range h.on(gone) {
			if closed[i] != "ECONNABORTED" {
				t.Errorf("socket %d on the removed backend: %q, want ECONNABORTED", i, closed[i])
			}
		}
		for i, why := range closed {
			if h.backend[i] != gone {
				t.Errorf("socket %d on %s, a backend still in service, closed: %s", i, h.backend[i], why)
			}
		}
	}
}

const removalServices = `services:
  - name: who
    vips: [198.19.0.10, "2001:db8:19::10"]
    ports:
      - {name: tcp, port: 80, protocol: TCP, targetPort: 8080}
      - {name: udp, port: 53, protocol: UDP, targetPort: 8080}
    backends:
%s`

// TestServiceBackendRemoval: sockets connected through a VIP to a backend
// that leaves the service are destroyed (their owners see ECONNABORTED
// and reconnect); sockets to the other backend, and bypassed ones among
// them, are untouched.
func TestServiceBackendRemoval(t *testing.T) {
	lb := newLBBed(t)
	be0, be1 := lb.back[0], lb.back[1]
	both := fmt.Sprintf("      - {ip: %s}\n      - {ip: %s}\n      - {ip: %s}\n      - {ip: %s}\n", be0.IPv4, be1.IPv4, be0.IPv6, be1.IPv6)
	lb.apply(t, fmt.Sprintf(removalServices, both))
	lbBefore, before := lb.lbCounters(t), lb.in.Counters()
	const n = 12
	holds := []*holder{
		startHold(t, lb.in, lb.client, n, "--mode", "tcp", "198.19.0.10:80"),
		startHold(t, lb.in, lb.client, n, "--mode", "tcp", "[2001:db8:19::10]:80"),
		startHold(t, lb.in, lb.client, n, "--mode", "udp", "198.19.0.10:53"),
		startHold(t, lb.in, lb.host, n, "--mode", "tcp", "198.19.0.10:80"),
	}
	mustAtLeast(t, testutil.Delta(lbBefore, lb.lbCounters(t)), "conns_tracked", 4*n)
	// The pod-to-pod TCP sockets are bypassed: destruction works there too.
	mustAtLeast(t, testutil.Delta(before, lb.in.Counters()), "conns_bypassed", 2*n)

	onlyBe1 := fmt.Sprintf("      - {ip: %s}\n      - {ip: %s}\n", be1.IPv4, be1.IPv6)
	checkRemoval(t, holds, "be0", func() map[string]float64 {
		return lb.applyJSON(t, fmt.Sprintf(removalServices, onlyBe1))
	})
	r := lb.probe(t, lb.client, "tcp", "198.19.0.10:80", 20)
	if r.Replies["be1"] != 20 {
		t.Errorf("after removing be0 new connections reached %v %v", r.Replies, r.Errors)
	}
	// Removing the whole service destroys the rest.
	checkRemoval(t, holds, "be1", func() map[string]float64 {
		return lb.applyJSON(t, "services: []\n")
	})
}

// TestServiceDNS: a real DNS server (dnsmasq) in two backend pods behind a
// UDP and TCP VIP, queried with a real client (dig); then one backend is
// removed and the connected sockets still pointing at it are destroyed.
func TestServiceDNS(t *testing.T) {
	dnsmasq := testutil.RequireCommand(t, "dnsmasq")
	dig := testutil.RequireCommand(t, "dig")
	lb := newLBBed(t)
	be0, be1 := lb.back[0], lb.back[1]
	for _, p := range lb.back {
		start(t, p, dnsmasq, "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
			"--user=root", "--group=root", "--port=53", "--pid-file="+lb.dir+"/dnsmasq-"+p.Name+".pid",
			"--host-record=who.svc.test,"+p.IPv4.String(), "--log-facility=-")
		waitPort(t, p, "[::]:53")
	}
	svc := func(backends ...*testbed.Pod) string {
		s := "services:\n  - name: dns\n    vips: [198.19.0.53]\n    ports:\n      - {name: dns, port: 53, protocol: UDP}\n      - {name: dns-tcp, port: 53, protocol: TCP}\n    backends:\n"
		for _, b := range backends {
			s += fmt.Sprintf("      - {ip: %s}\n", b.IPv4)
		}
		return s
	}
	lb.apply(t, svc(be0, be1))
	query := func(extra ...string) string {
		t.Helper()
		cmd, err := lb.client.Command(dig, append([]string{"@198.19.0.53", "who.svc.test", "A", "+short", "+tries=1", "+time=3"}, extra...)...)
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("dig %v: %v: %s", extra, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	answers := map[string]int{}
	for range 24 {
		answers[query()]++
	}
	if answers[be0.IPv4.String()] == 0 || answers[be1.IPv4.String()] == 0 || len(answers) != 2 {
		t.Fatalf("dig through the VIP answered %v, want both %s and %s", answers, be0.IPv4, be1.IPv4)
	}
	if a := query("+tcp"); a != be0.IPv4.String() && a != be1.IPv4.String() {
		t.Errorf("dig +tcp through the VIP: %q", a)
	}
	h := startHold(t, lb.in, lb.client, 16, "--mode", "dns", "--name", "who.svc.test", "198.19.0.53:53")
	checkRemoval(t, []*holder{h}, be0.IPv4.String(), func() map[string]float64 {
		return lb.applyJSON(t, svc(be1))
	})
	for range 6 {
		if a := query(); a != be1.IPv4.String() {
			t.Errorf("after removing be0, dig answered %q", a)
		}
	}
}

// TestServiceTrackedPrune: TCP sockets translated at connect are recorded
// by cookie (their getpeername answers from there, since they get no
// socket storage). Sockets that close while their cgroup is detached leave
// their entries behind; the next attach forgets exactly those, and keeps
// the entries of sockets still open.
func TestServiceTrackedPrune(t *testing.T) {
	lb := newLBBed(t)
	be0, be1 := lb.back[0], lb.back[1]
	lb.apply(t, fmt.Sprintf(removalServices, fmt.Sprintf("      - {ip: %s}\n      - {ip: %s}\n", be0.IPv4, be1.IPv4)))
	const n = 10
	base := trackedSockets(t, lb.in)
	live := startHold(t, lb.in, lb.host, n, "--mode", "tcp", "198.19.0.10:80")
	gone := startHold(t, lb.in, lb.client, n, "--mode", "tcp", "198.19.0.10:80")
	if got := trackedSockets(t, lb.in); got != base+2*n {
		t.Fatalf("tracked sockets %d with %d held open, want %d", got, 2*n, base+2*n)
	}
	lb.in.MustRun("detach", "--cgroup", lb.client.Cgroup)
	_ = gone.cmd.Process.Kill()
	_ = gone.cmd.Wait()
	// Nothing saw them close: their entries stay.
	if got := trackedSockets(t, lb.in); got != base+2*n {
		t.Fatalf("tracked sockets %d after closing %d unseen, want %d still", got, n, base+2*n)
	}
	lb.in.Attach(lb.client)
	if got := trackedSockets(t, lb.in); got != base+n {
		t.Errorf("tracked sockets %d after the attach pruned, want %d (the %d still open)", got, base+n, n)
	}
	// The sockets still open still see the VIP and are still destroyed
	// when their backend goes.
	r := lb.probe(t, lb.client, "tcp", "198.19.0.10:80", 20)
	if len(r.Errors) > 0 || r.PeerMismatch != 0 {
		t.Errorf("after the prune: errors %v, %d peers other than the VIP", r.Errors, r.PeerMismatch)
	}
	// The probe's sockets closed while attached: released, forgotten.
	if got := trackedSockets(t, lb.in); got != base+n {
		t.Errorf("tracked sockets %d after 20 translated sockets closed, want %d", got, base+n)
	}
	checkRemoval(t, []*holder{live}, "be0", func() map[string]float64 {
		return lb.applyJSON(t, fmt.Sprintf(removalServices, fmt.Sprintf("      - {ip: %s}\n", be1.IPv4)))
	})
}

// applyJSON applies services and returns the apply's report.
func (lb *lbBed) applyJSON(t *testing.T, yaml string) map[string]float64 {
	t.Helper()
	var r map[string]float64
	out := lb.in.MustRun("svc", "apply", "-f", lb.writeServices(t, yaml), "-o", "json")
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("svc apply -o json: %v: %s", err, out)
	}
	return r
}

// trackedSockets reads the load balancer's translated-socket table size.
func trackedSockets(t *testing.T, in *testutil.Instance) int {
	t.Helper()
	var st struct {
		Tracked int `json:"lb_tracked_sockets"`
	}
	if out := in.MustRun("status", "-o", "json"); json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("parsing status: %s", out)
	}
	return st.Tracked
}
