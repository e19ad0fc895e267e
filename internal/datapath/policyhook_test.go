package datapath

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/socklane/socklane/internal/cgroups"
	"github.com/socklane/socklane/internal/policy"
	"github.com/socklane/socklane/internal/testutil"
)

// TestPolicyHookPlacement: the policy's packet hook runs in pod cgroups
// only while a policy needs it there (every pod while one is isolated for
// ingress, the egress-isolated ones otherwise, none without isolation),
// as the kernel's own list of each cgroup's programs shows; and an apply
// takes the hook off the attachments a build that hooked all of them left
// (link_polingress_<id>), while the attachment's other hooks stay.
func TestPolicyHookPlacement(t *testing.T) {
	dir := testPinDir(t, "polhook")
	root, err := cgroups.Root()
	if err != nil {
		t.Fatalf("finding the cgroup v2 mount: %v", err)
	}
	d, err := Open(Config{PinDir: dir, Settings: Settings{Bypass: ModeOn, VerdictWindow: DefaultVerdictWindow}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = Pins(dir).DetachAll()
		d.Close()
	})
	// An attachment (the pods' parent) and three pods under it.
	base := filepath.Join(root, fmt.Sprintf("sltest-polhook-%d", os.Getpid()))
	mk := func(path string) uint64 {
		if err := os.Mkdir(path, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Remove(path) })
		id, err := cgroups.ID(path)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	baseID := mk(base)
	pods := map[string]uint64{}
	paths := map[string]string{}
	for _, p := range []string{"a", "b", "c"} {
		paths[p] = filepath.Join(base, p)
		pods[p] = mk(paths[p])
	}
	if _, err := d.Attach(base, baseID); err != nil {
		t.Fatal(err)
	}
	// What an older build left: the packet hook among the attachment's links.
	l, err := link.AttachCgroup(link.CgroupOptions{Path: base, Attach: ebpf.AttachCGroupInetIngress, Program: d.lb.SlPolIngress})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Pin(d.linkPin(legacyPolHook, baseID)); err != nil {
		t.Fatal(err)
	}
	l.Close()
	count := func(path string, at ebpf.AttachType) int { return testutil.AttachedCount(t, path, at) }
	if n := count(base, ebpf.AttachCGroupInetIngress); n != 1 {
		t.Fatalf("the old build's hook: the attachment runs %d cgroup_skb ingress programs, want 1", n)
	}
	baseEgress := count(base, ebpf.AttachCGroupInetEgress)
	tables := func(in, eg string) *policy.Tables {
		tb := &policy.Tables{IDs: map[string]uint32{}}
		for i, p := range []string{"a", "b", "c"} {
			e := policy.CgroupEntry{ID: pods[p]}
			e.Endpoint = uint32(i + 1)
			e.Isolated = [2]bool{p == in, p == eg}
			tb.Cgroups = append(tb.Cgroups, e)
		}
		if in != "" || eg != "" {
			tb.IDs["t/p"] = 1
		}
		return tb
	}
	for _, tt := range []struct {
		name, ingress, egress string
		hooked                []string
	}{
		{"ingress isolation hooks every pod", "a", "", []string{"a", "b", "c"}},
		{"egress isolation hooks the isolated pod", "", "b", []string{"b"}},
		{"no isolation hooks none", "", "", nil},
		{"both", "c", "a", []string{"a", "b", "c"}},
		{"none again", "", "", nil},
	} {
		st, err := d.ApplyPolicies(tables(tt.ingress, tt.egress), nil)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if st.Hooked != len(tt.hooked) {
			t.Errorf("%s: stats say %d hooked cgroups, want %d", tt.name, st.Hooked, len(tt.hooked))
		}
		for p, path := range paths {
			want := 0
			if slices.Contains(tt.hooked, p) {
				want = 1
			}
			if n := count(path, ebpf.AttachCGroupInetIngress); n != want {
				t.Errorf("%s: pod %s runs %d cgroup_skb ingress programs, want %d", tt.name, p, n, want)
			}
		}
		got, err := d.PolicyTargets()
		if err != nil || len(got) != len(tt.hooked) {
			t.Errorf("%s: PolicyTargets %v, %v; want %d cgroups", tt.name, got, err, len(tt.hooked))
		}
		if n := count(base, ebpf.AttachCGroupInetIngress); n != 0 {
			t.Errorf("%s: the attachment still runs %d cgroup_skb ingress programs (the old build's hook)", tt.name, n)
		}
		if n := count(base, ebpf.AttachCGroupInetEgress); n != baseEgress {
			t.Errorf("%s: the attachment's egress programs went from %d to %d", tt.name, baseEgress, n)
		}
	}
}
