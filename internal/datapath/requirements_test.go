package datapath

import (
	"errors"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/socklane/socklane/internal/testutil"
)

// TestRequirementsFromObjects: what the programs use is read from the
// embedded objects, and every item has the release that brought it (a
// helper added to the C without a release here fails this test).
func TestRequirementsFromObjects(t *testing.T) {
	b, err := loadBypass()
	if err != nil {
		t.Fatal(err)
	}
	l, err := loadServicelb()
	if err != nil {
		t.Fatal(err)
	}
	reqs := requirements(b, l)
	got := map[string]string{}
	for _, r := range reqs {
		got[r.What] = r.Since
		if r.Since == "" {
			t.Errorf("%s: no first release known", r.What)
		}
	}
	for what, since := range map[string]string{
		"program type syscall":                                      "5.14",
		"program type sk_msg":                                       "4.17",
		"attach type cgroup_inet4_get_peername":                     "5.8",
		"attach type cgroup_inet_sock_release":                      "5.9",
		"map type sock_map":                                         "4.14",
		"map type ring_buf":                                         "5.8",
		"helper bpf_get_netns_cookie for sock_ops programs":         "5.15",
		"helper bpf_get_netns_cookie for cgroup_sock_addr programs": "5.7",
		"helper bpf_set_retval for cgroup_sock_addr programs":       "5.18",
		"helper bpf_msg_redirect_map for sk_msg programs":           "4.17",
	} {
		if got[what] != since {
			t.Errorf("%q: since %q, want %q (all: %v)", what, got[what], since, got)
		}
	}
}

// TestMissingFeaturesError: every missing item is named with its release,
// and the advice is the first release that has them all.
func TestMissingFeaturesError(t *testing.T) {
	for _, tt := range []struct {
		missing []Requirement
		first   string
		want    []string
	}{
		{[]Requirement{{What: "program type syscall", Since: "5.14"}, {What: "helper bpf_set_retval for cgroup_sock_addr programs", Since: "5.18"},
			{What: "helper bpf_get_netns_cookie for sk_msg programs", Since: "5.15"}}, "5.18",
			[]string{"kernel 5.10.0-test lacks", "program type syscall (Linux 5.14)", "bpf_set_retval for cgroup_sock_addr programs (Linux 5.18)", "run socklane on Linux 5.18 or later"}},
		{[]Requirement{{What: "map type ring_buf", Since: "5.8"}, {What: "helper bpf_x for sk_msg programs", Since: "4.9"}}, "5.8",
			[]string{"map type ring_buf (Linux 5.8)", "Linux 5.8 or later"}},
		{[]Requirement{{What: "helper #9999 for sk_msg programs"}}, "",
			[]string{"#9999 for sk_msg programs (first release unknown to socklane)", "run socklane on a newer kernel"}},
	} {
		e := &MissingFeaturesError{Kernel: "5.10.0-test", Missing: tt.missing}
		if got := e.FirstKernel(); got != tt.first {
			t.Errorf("FirstKernel() = %q, want %q", got, tt.first)
		}
		for _, w := range tt.want {
			if !strings.Contains(e.Error(), w) {
				t.Errorf("error %q does not say %q", e.Error(), w)
			}
		}
	}
}

// TestCheckKernel probes the real kernel: this one has everything, and a
// program that calls a helper no kernel has, or uses an attach type no
// kernel knows, is refused by name, through the same probes.
func TestCheckKernel(t *testing.T) {
	testutil.RequireRoot(t)
	if err := CheckKernel(); err != nil {
		t.Fatalf("this kernel runs the datapath, but: %v", err)
	}
	spec := &ebpf.CollectionSpec{Programs: map[string]*ebpf.ProgramSpec{
		"p": {Type: ebpf.SkMsg, License: "GPL", Instructions: asm.Instructions{
			asm.BuiltinFunc(9999).Call(), asm.Mov.Imm(asm.R0, 1), asm.Return()}},
		"q": {Type: ebpf.CGroupSockAddr, AttachType: ebpf.AttachCGroupInet4Connect, License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}},
	}}
	reqs := requirements(spec)
	reqs = append(reqs, Requirement{What: "attach type number 250", Since: "99.0", probe: func() error {
		return probeAttachType(ebpf.CGroupSockAddr, ebpf.AttachType(250), 0)
	}})
	// What is probed under a missing program type is not named again.
	reqs = append(reqs, Requirement{What: "program type number 250", Since: "99.0", probe: func() error { return ebpf.ErrNotSupported }},
		Requirement{What: "helper under it", Since: "99.0", under: "program type number 250", probe: func() error { return ebpf.ErrNotSupported }})
	err := checkRequirements("this", reqs)
	var mf *MissingFeaturesError
	if !errors.As(err, &mf) {
		t.Fatalf("checkRequirements: %v, want a MissingFeaturesError", err)
	}
	var names []string
	for _, r := range mf.Missing {
		names = append(names, r.What)
	}
	if len(names) != 3 || !strings.Contains(names[0], "(9999) for sk_msg programs") || names[1] != "attach type number 250" || names[2] != "program type number 250" {
		t.Errorf("missing %q, want the unknown helper, attach type and program type only", names)
	}
	t.Log(err)
}
