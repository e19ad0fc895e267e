package datapath

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
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

func TestKernelAtLeast(t *testing.T) {
	for _, tt := range []struct {
		release string
		want    bool
	}{
		{"6.18.0-1-cloud-amd64", true},
		{"6.13.0", true},
		{"7.0.1", true},
		{"6.12.117+deb12-cloud-amd64", false},
		{"6.1.0-56-cloud-amd64", false},
		{"5.10.0-32-cloud-amd64", false},
		{"6.13-rc1", true},
		{"", false},
		{"six.thirteen", false},
	} {
		if got := kernelAtLeast(tt.release, 6, 13); got != tt.want {
			t.Errorf("kernelAtLeast(%q, 6, 13) = %v, want %v", tt.release, got, tt.want)
		}
	}
}
