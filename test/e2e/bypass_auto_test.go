package e2e

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/socklane/socklane/internal/sockbugs"
	"github.com/socklane/socklane/internal/testutil"
)

// TestBypassAuto: --bypass auto (the default) follows what the kernel's
// sockmap gets wrong, found at load: where FIONREAD answers 0 for
// redirected bytes, which hangs programs that size their reads by it, or
// sk_psock does not count queued bytes, which leaves slower readers with
// no backpressure (both on 6.1), every connection stays on TCP and such
// programs work (peek streams check FIONREAD against MSG_PEEK); elsewhere
// connections are bypassed. on and off do what they say on any kernel.
func TestBypassAuto(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"auto", nil},
		{"off", []string{"--bypass", "off"}},
		{"on", []string{"--bypass", "on"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := testutil.Bed(t)
			in := testutil.NewInstance(t)
			in.Settings = tt.args
			srv, cli := testutil.Pod(t, b, "server"), testutil.Pod(t, b, "client")
			in.Attach(srv, cli)
			st := readStatus(t, in)
			broken := st.Kernel.Has(sockbugs.FIONREAD) || !st.Kernel.PsockMsgTotLen
			want := tt.name == "on" || tt.name == "auto" && !broken
			if st.Settings.Bypass.On() != want {
				t.Fatalf("settings.bypass %v on an unfit kernel %v (%s), want %v", st.Settings.Bypass, broken, st.Kernel.Summary(), want)
			}
			if said := slices.ContainsFunc(st.Decided, func(d string) bool { return strings.HasPrefix(d, "bypass off: ") }); said != (broken && !want) {
				t.Errorf("status decided %q; want it to say why the bypass is off: %v", st.Decided, broken && !want)
			}
			before := in.Counters()
			const conns = 16
			integrity(t, in, srv, cli, "0.0.0.0:9000", netip.AddrPortFrom(srv.IPv4, 9000).String(), conns, "--io", "epoll")
			d := testutil.Delta(before, in.Counters())
			t.Logf("unfit kernel %v, bypass %v: %s", broken, want, nonzero(d))
			if want {
				mustAtLeast(t, d, "conns_bypassed", conns*3/4)
				mustAtLeast(t, d, "redirect_bytes", 1)
				mustEqual(t, d, "fallback_bypass_off", 0)
				return
			}
			mustEqual(t, d, "fallback_bypass_off", conns)
			mustEqual(t, d, "conns_bypassed", 0)
			mustEqual(t, d, "redirect_bytes", 0)
			mustEqual(t, d, "established_active", 0)
			if n := in.Sockets(); n != 0 {
				t.Errorf("%d sockets in the bypass map with the bypass off", n)
			}
		})
	}
}
