package datapath

import (
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/socklane/socklane/internal/sockbugs"
	"github.com/socklane/socklane/internal/testutil"
)

// TestAdaptKptrTag: without kptr_untrusted (before 6.3) the socket pointer
// fields of the maps carry the older name of the same tag.
func TestAdaptKptrTag(t *testing.T) {
	for _, tt := range []struct {
		untrusted bool
		want      string
	}{{true, "kptr_untrusted"}, {false, "kptr"}} {
		spec, err := loadBypass()
		if err != nil {
			t.Fatal(err)
		}
		Features{KptrUntrusted: tt.untrusted, PsockMsgTotLen: true}.retag(spec)
		found := 0
		for _, m := range spec.Maps {
			st, ok := m.Value.(*btf.Struct)
			if !ok {
				continue
			}
			for _, mem := range st.Members {
				if p, ok := mem.Type.(*btf.Pointer); ok {
					if tag, ok := p.Target.(*btf.TypeTag); ok {
						found++
						if tag.Value != tt.want {
							t.Errorf("%s.%s tagged %q, want %q", m.Name, mem.Name, tag.Value, tt.want)
						}
					}
				}
			}
		}
		if found < 3 { // sl_conn_socks.client, .server, sl_listeners.sk
			t.Errorf("%d tagged pointer fields, want 3", found)
		}
	}
}

// TestProbeFeatures: the running kernel is probed, with the negative
// control of a tag no kernel knows.
func TestProbeFeatures(t *testing.T) {
	testutil.RequireRoot(t)
	f, err := ProbeFeatures()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v, adapted: %v", f, f.Adapted())
	if ok, err := probeKptrTag("kptr_no_such_tag", ebpf.Array); err != nil || ok {
		t.Errorf("an unknown tag probed as a kptr: %v %v", ok, err)
	}
}

// TestValveUnfit: the valve runs only where sk_psock counts queued bytes,
// the kernel's sockmap was probed and redirected bytes are charged to
// their reader, and where its sk_skb verdict can read a segment's sequence
// number; each refusal names its reason.
func TestValveUnfit(t *testing.T) {
	charged := Features{PsockMsgTotLen: true, CastKernCtx: true, Bugs: []sockbugs.Bug{sockbugs.Describe(sockbugs.BlockingEAGAIN)}}
	for _, tt := range []struct {
		f    Features
		want string // in the reason; "" for fit
	}{
		{charged, ""},
		{Features{PsockMsgTotLen: true, CastKernCtx: true}, ""},
		{Features{}, "msg_tot_len"},
		{Features{PsockMsgTotLen: true}, "no bpf_cast_to_kern_ctx"},
		{Features{PsockMsgTotLen: true, CastKernCtx: true, BugsError: "making a private network namespace: EPERM"}, "could not be probed (making a private"},
		{Features{PsockMsgTotLen: true, CastKernCtx: true, Bugs: []sockbugs.Bug{sockbugs.Describe(sockbugs.Uncharged)}}, "redirect_uncharged; fixed by d888b7af7c14"},
	} {
		got := tt.f.ValveUnfit()
		if tt.want == "" && got != "" || tt.want != "" && !strings.Contains(got, tt.want) || tt.f.ValveFit() != (got == "") {
			t.Errorf("ValveUnfit(%+v) = %q (fit %v), want %q", tt.f, got, tt.f.ValveFit(), tt.want)
		}
		// status names the reason where the backlog rule stands in for
		// it (where msg_tot_len is missing, Adapted says so).
		decided := strings.Join(tt.f.Decided(DefaultSettings().Resolve(tt.f)), "\n")
		if named := strings.Contains(decided, "the valve, which would push"); named != (got != "" && tt.f.PsockMsgTotLen) || named && !strings.Contains(decided, got) {
			t.Errorf("Decided on %+v: %q, want the valve's reason %q named only where msg_tot_len is there", tt.f, decided, got)
		}
	}
}
