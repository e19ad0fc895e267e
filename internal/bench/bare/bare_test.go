package bare

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/testbed"
	"github.com/socklane/socklane/internal/testutil"
)

// TestBareRedirects: attached to two pods, the reference joins both ends
// of a connection between them (the server a dual-stack listener's
// IPv4-mapped socket) and redirects every send. Attached to the server's
// pod only, the server's sends find no peer and the client's reach it
// through TCP: with the stream verdict they pass through it into the
// server's psock (as socklane's valve passes them), without it they never
// meet a program. Once detached, new connections are left alone.
func TestBareRedirects(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Binary(t)
	for i, sv := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream verdict %v", sv), func(t *testing.T) {
			b := testutil.Bed(t)
			srv, cli := testutil.Pod(t, b, "server"), testutil.Pod(t, b, "client")
			p, err := Load(Options{StreamVerdict: sv})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if got, want := len(p.Programs()), map[bool]int{false: 2, true: 3}[sv]; got != want {
				t.Errorf("%d programs, want %d", got, want)
			}
			port := uint16(7950 + i)
			server, err := srv.Command(bin, "peer", "echo", fmt.Sprintf("0.0.0.0:%d", port))
			if err != nil {
				t.Fatal(err)
			}
			if err := server.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = server.Process.Kill(); _ = server.Wait() }()
			target := netip.AddrPortFrom(srv.IPv4, port).String()
			run := func(attached ...*testbed.Pod) Counts {
				t.Helper()
				if err := p.Detach(); err != nil {
					t.Fatal(err)
				}
				for _, pod := range attached {
					if err := p.Attach(pod.Cgroup); err != nil {
						t.Fatal(err)
					}
				}
				before, err := p.Counts()
				if err != nil {
					t.Fatal(err)
				}
				pingpong(t, bin, cli, target)
				after, err := p.Counts()
				if err != nil {
					t.Fatal(err)
				}
				return Counts{after.Redirected - before.Redirected, after.Missed - before.Missed, after.Joined - before.Joined,
					after.JoinFailed - before.JoinFailed, after.SkbPassed - before.SkbPassed}
			}
			// Both ends joined at the handshake, before any byte: every
			// send redirected; the stream verdict sees the client's FIN
			// at most (TCP queues it as a segment of its own).
			if d := run(srv, cli); d.Joined < 2 || d.Redirected < 2*200 || d.JoinFailed != 0 || d.SkbPassed > 1 {
				t.Errorf("both pods attached: %+v; want 2 joined, 400 redirected, no segment passed but a FIN", d)
			}
			// The server alone in the map: its 200 replies find no peer,
			// the client's 200 requests come through TCP, one segment each.
			d := run(srv)
			if d.Joined != 1 || d.Redirected != 0 || d.Missed < 200 {
				t.Errorf("server's pod attached: %+v; want 1 joined, none redirected, 200 missed", d)
			}
			if sv && d.SkbPassed < 200 || !sv && d.SkbPassed != 0 {
				t.Errorf("server's pod attached, stream verdict %v: %d segments passed", sv, d.SkbPassed)
			}
			if d := run(); d != (Counts{}) {
				t.Errorf("detached, the counts moved: %+v", d)
			}
		})
	}
}

// pingpong runs 200 round trips of 512 bytes from the client's pod,
// retried until the server listens.
func pingpong(t *testing.T, bin string, cli *testbed.Pod, target string) {
	t.Helper()
	var err error
	for range 50 {
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
