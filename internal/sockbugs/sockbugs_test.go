package sockbugs

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/socklane/socklane/internal/testutil"
)

// TestDetect runs every probe on this kernel: each reports what it saw.
// On this machine's 6.18 FIONREAD and MSG_PEEK are fixed and splice is not.
func TestDetect(t *testing.T) {
	testutil.RequireRoot(t)
	r, err := Detect()
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Bugs) != len(Names()) {
		t.Fatalf("%d bugs probed, want %d", len(r.Bugs), len(Names()))
	}
	for _, b := range r.Bugs {
		t.Logf("%s: present %v (%s)", b.Name, b.Present, b.Seen)
		if b.Seen == "" || b.Effect == "" || b.Fix == "" {
			t.Errorf("%s: incomplete report %+v", b.Name, b)
		}
	}
	if !r.Has(Splice) {
		t.Errorf("splice sees redirected bytes here: no kernel has that fix; the probe is wrong")
	}
}

// TestProbesOnPlainTCP is the probes' negative control: over plain TCP,
// which has none of these bugs, each must find nothing.
func TestProbesOnPlainTCP(t *testing.T) {
	testutil.RequireRoot(t)
	r, err := detectIn(false)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Bugs) != len(Names()) {
		t.Fatalf("%d probes ran, want %d", len(r.Bugs), len(Names()))
	}
	for _, b := range r.Bugs {
		if b.Present {
			t.Errorf("%s found on plain TCP (%s): the probe is wrong", b.Name, b.Seen)
		}
	}
}

// TestTCPBytesIntoMapSocket: a socket in a socket map with no stream
// verdict (socklane's plain map) whose peer sends through TCP (before the
// peer joins, after a fallback, a peer socklane does not manage) is woken
// by epoll for each of those sends, level- and edge-triggered (Go's
// netpoller, libuv and asyncio wait edge-triggered), and reads every byte.
// Kernels carrying 929e30f93125 (stable 6.6.128, 6.12.75, 6.18.14) were
// reported to lose that wake-up; this is the check on each kernel the
// matrix boots. What FIONREAD counts there is logged: socklane does not
// rely on it (the valve's verdict counts TCP's bytes, the plain map's
// sockets leave by timer). Plain TCP is the control.
func TestTCPBytesIntoMapSocket(t *testing.T) {
	testutil.RequireRoot(t)
	for _, tt := range []struct {
		name   string
		mode   pairMode
		events uint32
	}{
		{"plain TCP, edge-triggered", pairTCP, unix.EPOLLIN | unix.EPOLLET},
		{"in a map, level-triggered", pairServerInMap, unix.EPOLLIN},
		{"in a map, edge-triggered", pairServerInMap, unix.EPOLLIN | unix.EPOLLET},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := InPrivateNetns(func() error {
				p, err := newPair(tt.mode)
				if err != nil {
					return err
				}
				defer p.close()
				if err := unix.SetNonblock(p.server, true); err != nil {
					return err
				}
				ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
				if err != nil {
					return err
				}
				defer unix.Close(ep)
				if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, p.server, &unix.EpollEvent{Events: tt.events, Fd: int32(p.server)}); err != nil {
					return err
				}
				// Three sends, each while the reader waits with its
				// socket drained: every one must wake it.
				for round := range 3 {
					msg := fmt.Sprintf("%s-%d", probeMessage, round)
					n, err := epollWaitWhile(ep, probeSignalWait, 2*time.Second, func() error {
						_, err := unix.Write(p.client, []byte(msg))
						return err
					})
					if err != nil {
						return fmt.Errorf("send %d: %w", round, err)
					}
					if n != 1 {
						return fmt.Errorf("send %d: epoll_wait returned %d events in 2 s for %d bytes sent through TCP", round, n, len(msg))
					}
					inq, _ := unix.IoctlGetInt(p.server, unix.SIOCINQ)
					got := make([]byte, 0, len(msg))
					buf := make([]byte, 64)
					for deadline := time.Now().Add(2 * time.Second); len(got) < len(msg) && time.Now().Before(deadline); {
						n, err := unix.Read(p.server, buf)
						if n > 0 {
							got = append(got, buf[:n]...)
						} else if err != nil && !errors.Is(err, unix.EAGAIN) {
							return err
						} else {
							time.Sleep(time.Millisecond)
						}
					}
					if string(got) != msg {
						return fmt.Errorf("send %d: read %q, want %q", round, got, msg)
					}
					t.Logf("send %d: woken, %d bytes read, FIONREAD said %d", round, len(got), inq)
				}
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
}
