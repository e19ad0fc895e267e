package bare

import (
	"net/netip"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/testutil"
)

// TestBareRedirects: attached to two pods, the reference joins both ends
// of a connection between them (the server a dual-stack listener's
// IPv4-mapped socket) and redirects every send; once detached, new
// connections are left alone.
func TestBareRedirects(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Binary(t)
	b := testutil.Bed(t)
	srv, cli := testutil.Pod(t, b, "server"), testutil.Pod(t, b, "client")
	p, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, pod := range []string{srv.Cgroup, cli.Cgroup} {
		if err := p.Attach(pod); err != nil {
			t.Fatal(err)
		}
	}
	server, err := srv.Command(bin, "peer", "echo", "0.0.0.0:7950")
	if err != nil {
		t.Fatal(err)
	}
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = server.Process.Kill(); _ = server.Wait() }()
	target := netip.AddrPortFrom(srv.IPv4, 7950).String()
	pingpong := func() {
		t.Helper()
		var err error
		for i := 0; i < 50; i++ { // until the server listens
			cmd, cerr := cli.Command(bin, "peer", "pingpong", target, "--size", "512", "--count", "200", "--warmup", "0")
			if cerr != nil {
				t.Fatal(cerr)
			}
			var out []byte
			if out, err = cmd.CombinedOutput(); err == nil {
				return
			}
			t.Logf("pingpong: %v: %s", err, out)
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatal(err)
	}
	before, err := p.Counts()
	if err != nil {
		t.Fatal(err)
	}
	pingpong()
	after, err := p.Counts()
	if err != nil {
		t.Fatal(err)
	}
	joined, redirected := after.Joined-before.Joined, after.Redirected-before.Redirected
	if joined < 2 || redirected < 2*200 || after.JoinFailed != before.JoinFailed {
		t.Errorf("attached: %d sockets joined (%d refused), %d sends redirected (%d found no peer); want 2 and 400", joined,
			after.JoinFailed-before.JoinFailed, redirected, after.Missed-before.Missed)
	}
	if err := p.Detach(); err != nil {
		t.Fatal(err)
	}
	before = after
	pingpong()
	if after, err = p.Counts(); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("detached, the counts moved: %+v then %+v", before, after)
	}
}
