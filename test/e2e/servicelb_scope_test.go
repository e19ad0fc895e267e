package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/socklane/socklane/internal/testbed"
	"github.com/socklane/socklane/internal/testutil"
)

// TestServiceScope: the sockets the load balancer translates for. A
// network namespace opted out (`svc optout`, as the agent does for pods
// labelled socklane.io/service-lb=off) connects to the service address
// untranslated, counted, while other pods are balanced as before, and
// again once opted back in; with --service-lb-scope host only the host's
// namespace is balanced (pods' service traffic is kube-proxy's, as a
// service mesh needs).
func TestServiceScope(t *testing.T) {
	services := func(lb *lbBed) string {
		return fmt.Sprintf("services:\n  - name: who\n    vips: [198.19.0.30]\n    ports: [{port: 80, targetPort: 8080}]\n    backends: [{ip: %s}, {ip: %s}]\n", lb.back[0].IPv4, lb.back[1].IPv4)
	}
	balanced := func(t *testing.T, lb *lbBed, from *testbed.Pod, want bool) {
		t.Helper()
		before := lb.lbCounters(t)
		r := lb.probe(t, from, "tcp", "198.19.0.30:80", 4)
		d := testutil.Delta(before, lb.lbCounters(t))
		got := r.Replies["be0"]+r.Replies["be1"] == 4
		switch {
		case want && (!got || d["selected"] < 4):
			t.Errorf("%s: not balanced: %v %v, counters %v", from.Name, r.Replies, r.Errors, d)
		case !want && (len(r.Replies) != 0 || d["selected"] != 0 || d["out_of_scope"] < 1):
			t.Errorf("%s: balanced, want it left untranslated: %v, counters %v", from.Name, r.Replies, d)
		}
	}
	t.Run("pod opted out", func(t *testing.T) {
		lb := newLBBed(t)
		routeVIPsNowhere(t, lb.client)
		lb.apply(t, services(lb))
		balanced(t, lb, lb.client, true)
		out := lb.in.MustRun("svc", "optout", lb.client.NetNS)
		if !strings.Contains(out, "opted out") {
			t.Errorf("svc optout: %s", out)
		}
		var list struct {
			Netns []uint64 `json:"netns"`
		}
		if err := json.Unmarshal([]byte(lb.in.MustRun("svc", "optout", "-o", "json")), &list); err != nil || len(list.Netns) != 1 {
			t.Errorf("svc optout list: %+v %v", list, err)
		}
		balanced(t, lb, lb.client, false)
		balanced(t, lb, lb.host, true)
		lb.in.MustRun("svc", "optout", "--undo", lb.client.NetNS)
		balanced(t, lb, lb.client, true)
		if _, err := lb.in.Run("svc", "optout", "/nonexistent/ns"); err == nil {
			t.Errorf("svc optout of a missing namespace succeeded")
		}
	})
	t.Run("host namespace only", func(t *testing.T) {
		lb := newLBBed(t, "--service-lb-scope", "host")
		routeVIPsNowhere(t, lb.client)
		lb.apply(t, services(lb))
		balanced(t, lb, lb.host, true)
		balanced(t, lb, lb.client, false)
		if st := readStatus(t, lb.in); st.Settings.LbHostOnly != 1 {
			t.Errorf("status settings %+v, want host-only", st.Settings)
		}
	})
}
