package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/testbed"
	"github.com/socklane/socklane/internal/testutil"
)

const lbServices = `services:
  - name: who
    vips: [198.19.0.10, "2001:db8:19::10"]
    ports:
      - {name: tcp, port: 80, protocol: TCP, targetPort: 8080}
      - {name: udp, port: 53, protocol: UDP, targetPort: 8080}
    backends:
      - {ip: %[1]s}
      - {ip: %[2]s}
      - {ip: %[3]s}
      - {ip: %[4]s}
  - name: sticky
    vips: [198.19.0.11]
    ports: [{port: 80, targetPort: 8080}]
    sessionAffinity: ClientIP
    sessionAffinityTimeoutSeconds: 60
    backends: [{ip: %[1]s}, {ip: %[2]s}]
  - name: empty
    vips: [198.19.0.12]
    ports: [{port: 80}]
    backends: []
  - name: draining
    vips: [198.19.0.13]
    ports: [{port: 80, targetPort: 8080}]
    backends: [{ip: %[1]s, ready: false}, {ip: %[2]s, terminating: true}]
`

// TestServiceLB: TCP, connected and unconnected UDP through a VIP, IPv4
// and IPv6, from a pod and from the host network; the application sees the
// VIP; selection spreads; affinity holds per workload; no backend refuses.
func TestServiceLB(t *testing.T) {
	lb := newLBBed(t)
	be0, be1 := lb.back[0], lb.back[1]
	out := lb.apply(t, fmt.Sprintf(lbServices, be0.IPv4, be1.IPv4, be0.IPv6, be1.IPv6))
	if !strings.Contains(out, "applied 4 services") {
		t.Fatalf("svc apply: %s", out)
	}
	before := lb.lbCounters(t)
	const n = 200
	for _, tc := range []struct {
		name   string
		from   *testbed.Pod
		mode   string
		target string
	}{
		{"tcp v4 from pod", lb.client, "tcp", "198.19.0.10:80"},
		{"tcp v6 from pod", lb.client, "tcp", "[2001:db8:19::10]:80"},
		{"tcp v4 from host network", lb.host, "tcp", "198.19.0.10:80"},
		{"connected udp v4", lb.client, "udp", "198.19.0.10:53"},
		{"connected udp v6", lb.client, "udp", "[2001:db8:19::10]:53"},
		{"unconnected udp v4", lb.client, "udp-unconnected", "198.19.0.10:53"},
		{"unconnected udp v6", lb.client, "udp-unconnected", "[2001:db8:19::10]:53"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := lb.probe(t, tc.from, tc.mode, tc.target, n)
			if len(r.Errors) > 0 {
				t.Fatalf("errors %v (first: %s)", r.Errors, r.FirstError)
			}
			if r.PeerMismatch != 0 {
				t.Errorf("%d of %d sockets saw a peer other than the VIP (last %s)", r.PeerMismatch, n, r.LastPeer)
			}
			total := r.Replies["be0"] + r.Replies["be1"]
			if total != n {
				t.Fatalf("replies %v, want %d from be0 and be1", r.Replies, n)
			}
			if tc.mode == "udp-unconnected" {
				// One socket keeps the backend it was given.
				if r.Replies["be0"] != n && r.Replies["be1"] != n {
					t.Errorf("one unconnected socket was spread over backends: %v", r.Replies)
				}
				return
			}
			// Uniform choice: each backend gets 100 of 200 +- 5 sigma.
			for _, be := range []string{"be0", "be1"} {
				if c := r.Replies[be]; c < 65 || c > 135 {
					t.Errorf("%s answered %d of %d: not roughly uniform (%v)", be, c, n, r.Replies)
				}
			}
		})
	}
	d := testutil.Delta(before, lb.lbCounters(t))
	mustAtLeast(t, d, "selected", 6*n)
	mustAtLeast(t, d, "peername", 4*n)
	mustAtLeast(t, d, "udp_reversed", 2*n)

	t.Run("affinity per pod", func(t *testing.T) {
		r := lb.probe(t, lb.client, "tcp", "198.19.0.11:80", 50)
		if len(r.Replies) != 1 || len(r.Errors) > 0 {
			t.Fatalf("with ClientIP affinity one pod reached %v (errors %v)", r.Replies, r.Errors)
		}
		// Containers sharing a network namespace (here host-network
		// processes in cgroups of their own, sharing the node's
		// address) share the choice, as kube-proxy's by source address.
		var shared string
		hosts := 6
		if testing.Short() {
			hosts = 3 // emulated kernels: each workload takes seconds
		}
		for i := range hosts {
			h := testutil.HostPod(t, lb.bed, fmt.Sprintf("h%d", i))
			lb.in.Attach(h)
			r := lb.probe(t, h, "tcp", "198.19.0.11:80", 3)
			if len(r.Replies) != 1 {
				t.Fatalf("host-network workload h%d was spread: %v", i, r.Replies)
			}
			for k := range r.Replies {
				if shared != "" && k != shared {
					t.Errorf("host-network workloads (one namespace) got %s and %s", shared, k)
				}
				shared = k
			}
		}
		// Another pod gets its own choice: over several pods both
		// backends show up.
		seen := map[string]bool{}
		for i := 0; i < 20 && len(seen) < 2; i++ {
			p := testutil.Pod(t, lb.bed, fmt.Sprintf("a%d", i))
			lb.in.Attach(p)
			r := lb.probe(t, p, "tcp", "198.19.0.11:80", 3)
			if len(r.Replies) != 1 {
				t.Fatalf("pod a%d was spread: %v", i, r.Replies)
			}
			for k := range r.Replies {
				seen[k] = true
			}
		}
		if len(seen) < 2 {
			t.Errorf("20 pods all got the same backend: affinity shared between pods?")
		}
	})
	t.Run("no backend refuses at once", func(t *testing.T) {
		before := lb.lbCounters(t)
		startT := time.Now()
		r := lb.probe(t, lb.client, "tcp", "198.19.0.12:80", 3)
		if r.Errors["ECONNREFUSED"] != 3 {
			t.Fatalf("connect to a service without backends: %v, want ECONNREFUSED x3", r.Errors)
		}
		if el := time.Since(startT); el > 5*time.Second {
			t.Errorf("refusal took %s", el)
		}
		mustEqual(t, testutil.Delta(before, lb.lbCounters(t)), "no_backend", 3)
	})
	t.Run("status shows service metrics", func(t *testing.T) {
		var st struct {
			LB       map[string]uint64 `json:"lb_counters"`
			Services []struct {
				Namespace, Name string
				Selected        map[string]uint64 `json:"selected"`
				Refused         uint64            `json:"refused"`
			} `json:"services"`
		}
		if err := json.Unmarshal([]byte(lb.in.MustRun("status", "-o", "json")), &st); err != nil {
			t.Fatal(err)
		}
		got := map[string]uint64{}
		for _, s := range st.Services {
			var sel uint64
			for _, n := range s.Selected {
				sel += n
			}
			got[s.Name+".selected"], got[s.Name+".refused"] = sel, s.Refused
		}
		if got["empty.refused"] != 3 || got["who.selected"] < 7*n || got["sticky.selected"] < 50 || st.LB["selected"] < 7*n {
			t.Errorf("status service metrics %v, lb counters %v", got, st.LB)
		}
		if out := lb.in.MustRun("status"); !strings.Contains(out, "service default/empty") || !strings.Contains(out, "lb no_backend") {
			t.Errorf("status text lacks service metrics:\n%s", out)
		}
	})
	t.Run("terminating used when none ready", func(t *testing.T) {
		before := lb.lbCounters(t)
		r := lb.probe(t, lb.client, "tcp", "198.19.0.13:80", 20)
		if r.Replies["be1"] != 20 {
			t.Fatalf("want every connection on the terminating backend be1, got %v %v", r.Replies, r.Errors)
		}
		mustEqual(t, testutil.Delta(before, lb.lbCounters(t)), "terminating_used", 20)
	})
	t.Run("recorded services readable by root only", func(t *testing.T) {
		dir := node.StateDir(lb.in.Name)
		for path, want := range map[string]os.FileMode{node.StateRoot: 0o700, dir: 0o700, filepath.Join(dir, "services.json"): 0o600} {
			if st, err := os.Stat(path); err != nil {
				t.Errorf("%s: %v, want mode %v", path, err, want)
			} else if st.Mode().Perm() != want {
				t.Errorf("%s: mode %v, want %v", path, st.Mode().Perm(), want)
			}
		}
	})
	t.Run("get shows per-backend selections", func(t *testing.T) {
		out := lb.in.MustRun("svc", "get", "who")
		if !strings.Contains(out, "default/who") || !strings.Contains(out, netip.AddrFrom4([4]byte{198, 19, 0, 10}).String()) {
			t.Errorf("svc get who:\n%s", out)
		}
		var st struct {
			Services []struct {
				Selected map[string]uint64 `json:"selected"`
			} `json:"services"`
		}
		if err := json.Unmarshal([]byte(lb.in.MustRun("svc", "get", "who", "-o", "json")), &st); err != nil || len(st.Services) != 1 {
			t.Fatalf("svc get who -o json: %v %+v", err, st)
		}
		var sum uint64
		for _, n := range st.Services[0].Selected {
			sum += n
		}
		// The seven probes above, 200 each, all to "who".
		if sum < 7*n {
			t.Errorf("per-backend selections of who add up to %d, want >= %d: %v", sum, 7*n, st.Services[0].Selected)
		}
	})
}

// TestServiceBadYAML: every kind of bad file is refused with its line and
// field, and nothing of it is applied.
func TestServiceBadYAML(t *testing.T) {
	lb := newLBBed(t)
	good := fmt.Sprintf("services:\n  - name: who\n    vips: [198.19.0.10]\n    ports: [{port: 80, targetPort: 8080}]\n    backends: [{ip: %s}]\n", lb.back[0].IPv4)
	lb.apply(t, good)
	for _, tc := range []struct{ name, yaml, want string }{
		{"not yaml", "services: [", "parsing YAML"},
		{"unknown field", "services:\n  - name: a\n    vip: [198.19.0.1]\n", "line 3: field vip not found"},
		{"bad protocol", "services:\n  - name: a\n    vips: [198.19.0.1]\n    ports: [{port: 80, protocol: SCTP}]\n", "line 4: services[0].ports[0].protocol"},
		{"bad address", "services:\n  - name: a\n    vips: [198.19.0.300]\n    ports: [{port: 80}]\n", "line 3"},
		{"family mismatch", "services:\n  - name: a\n    vips: [198.19.0.1]\n    ports: [{port: 80}]\n    backends: [{ip: '2001:db8::1'}]\n", "services[0].backends[0].ip"},
		{"duplicate frontend", "services:\n  - name: a\n    vips: [198.19.0.1]\n    ports: [{port: 80}]\n  - name: b\n    vips: [198.19.0.1]\n    ports: [{port: 80}]\n", "already served by default/a"},
		{"bad name", "services:\n  - name: Web_1\n    vips: [198.19.0.1]\n    ports: [{port: 80}]\n", "not a DNS label"},
		{"bad timeout", "services:\n  - name: a\n    vips: [198.19.0.1]\n    ports: [{port: 80}]\n    sessionAffinity: ClientIP\n    sessionAffinityTimeoutSeconds: 0\n", "want 1 to 86400"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(lb.dir, "bad.yaml")
			if err := os.WriteFile(f, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := lb.in.Run("svc", "apply", "-f", f)
			if err == nil || !strings.Contains(out, tc.want) {
				t.Fatalf("want an error saying %q, got %v: %s", tc.want, err, out)
			}
			// The good service still answers, nothing else appeared.
			r := lb.probe(t, lb.client, "tcp", "198.19.0.10:80", 2)
			if r.Replies["be0"] != 2 {
				t.Fatalf("after a refused apply the service answers %v %v", r.Replies, r.Errors)
			}
			if got := lb.in.MustRun("svc", "list"); strings.Count(got, "default/") != 1 {
				t.Fatalf("svc list after a refused apply:\n%s", got)
			}
		})
	}
}
