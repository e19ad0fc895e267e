package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/sockbugs"
	"github.com/socklane/socklane/internal/testutil"
)

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// blockingPeer is a Python program reading and writing with blocking
// sockets: "server PORT CONNS [SIGNAL]" echoes CONNS connections one
// after the other, "client ADDR CONNS BYTES [SIGNAL]" sends BYTES on each
// and reads the echo back, checking every byte; the server waits 2 ms
// before each echo, so the client waits in its reads. With SIGNAL the program
// handles it (a handler that does nothing, as a program's reload or
// child-reaping handler would); a client handling SIGALRM also has a
// timer deliver it every millisecond while it reads, so that its blocking
// reads are interrupted all the time. Python retries a read a signal
// interrupted (EINTR); the sockmap's receive path answers EAGAIN instead,
// which Python raises: a connection bypassed against the rule fails here
// (the last case forces one, the attack itself).
// Both leave by os._exit: Python's own exit puts its handlers back to the
// defaults, and the signals still arriving would then end it.
const blockingPeer = `
import os, select, socket, signal, sys, time
role, where, conns = sys.argv[1], sys.argv[2], int(sys.argv[3])
sig = sys.argv[5] if len(sys.argv) > 5 else ""
if sig:
    signal.signal(getattr(signal, sig), lambda s, f: None)
if role == "server":
    # "nonblocking": listen and accept blocking, then make each accepted
    # socket non-blocking and wait in select(), as postgres' backends do.
    nb = sys.argv[4] == "nonblocking"
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", int(where)))
    ls.listen(64)
    print("listening", flush=True)
    for _ in range(conns):
        c, _ = ls.accept()
        c.setblocking(not nb)
        while True:
            if nb:
                select.select([c], [], [])
            b = c.recv(65536)
            if not b:
                break
            time.sleep(0.002) # the client waits in its read meanwhile
            while b:
                if nb:
                    select.select([], [c], [])
                b = b[c.send(b):]
        c.close()
    os._exit(0)
host, port = where.rsplit(":", 1)
size = int(sys.argv[4])
pattern = bytes(range(251)) * (65536 // 251 + 1)
if sig == "SIGALRM":
    signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
for n in range(conns):
    s = socket.create_connection((host, int(port)))
    sent = got = 0
    while got < size:
        if sent < size:
            k = min(16384, size - sent)
            s.sendall(pattern[sent % 251:sent % 251 + k])
            sent += k
        b = s.recv(65536)
        if not b:
            sys.exit("connection %d: end of stream after %d of %d bytes" % (n, got, size))
        want = pattern[got % 251:got % 251 + len(b)]
        if b != want:
            sys.exit("connection %d: bytes %d-%d differ" % (n, got, got + len(b)))
        got += len(b)
    s.close()
print("ok %d" % conns, flush=True)
os._exit(0)
`

// TestBlockingSignals: with the default --blocking-sockets (per process
// where the kernel has the interrupted-read bug, as here), blocking readers
// whose process handles no signal that can interrupt a read are bypassed,
// and those that handle one stay on TCP: a client interrupted by SIGALRM
// every millisecond while it reads, a server handling SIGUSR1 that is sent
// SIGUSR1 while it serves. Every byte is checked; the kernel's counters say
// which path each took. --blocking-sockets tcp keeps even quiet readers on
// TCP.
func TestBlockingSignals(t *testing.T) {
	testutil.RequireCommand(t, "python3")
	script := filepath.Join(t.TempDir(), "peer.py")
	if err := os.WriteFile(script, []byte(blockingPeer), 0o644); err != nil {
		t.Fatal(err)
	}
	const conns, size = 6, 1 << 20
	tests := []struct {
		name, setting, serverSig, clientSig string
		bypassed                            bool
		// nonblocking: the server accepts blocking and reads its
		// accepted sockets non-blocking; the first connection, predicted
		// from the listener, stays on TCP and teaches it.
		nonblocking  bool
		signalServer bool
		// meetsBug: forced into the bypass, the client's interrupted
		// read answers EAGAIN where the kernel has the bug.
		meetsBug bool
	}{
		{name: "quiet ends", bypassed: true},
		{name: "client interrupted by its SIGALRM timer", clientSig: "SIGALRM"},
		{name: "server handling SIGUSR1, sent it while serving", serverSig: "SIGUSR1", signalServer: true},
		{name: "client handling SIGTERM only (a stop request)", clientSig: "SIGTERM", bypassed: true},
		{name: "server handling SIGUSR1, accepted sockets non-blocking", serverSig: "SIGUSR1", signalServer: true, nonblocking: true},
		{name: "quiet ends, --blocking-sockets tcp", setting: "tcp"},
		{name: "the SIGALRM client forced into the bypass", clientSig: "SIGALRM", setting: "bypass", meetsBug: true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := testutil.Bed(t)
			in := testutil.NewInstance(t)
			if tt.setting != "" {
				in.Settings = append(in.Settings, "--blocking-sockets", tt.setting)
			}
			srv, cli := testutil.Pod(t, b, "server"), testutil.Pod(t, b, "client")
			in.Attach(srv, cli)
			port := strconv.Itoa(9300 + i)
			before := in.Counters()
			mode := "blocking"
			if tt.nonblocking {
				mode = "nonblocking"
			}
			server := start(t, srv, "python3", script, "server", port, strconv.Itoa(conns), mode, tt.serverSig)
			waitPort(t, srv, "0.0.0.0:"+port)
			stop := make(chan struct{})
			if tt.signalServer {
				go func() {
					for {
						select {
						case <-stop:
							return
						case <-time.After(2 * time.Millisecond):
							_ = server.cmd.Process.Signal(syscall.SIGUSR1)
						}
					}
				}()
			}
			args := []string{script, "client", srv.IPv4.String() + ":" + port, strconv.Itoa(conns), strconv.Itoa(size), tt.clientSig}
			if tt.meetsBug {
				if !readStatus(t, in).Kernel.Has(sockbugs.BlockingEAGAIN) {
					t.Skip("this kernel restarts an interrupted read in the bypass too: nothing to meet")
				}
				client := start(t, cli, "python3", args...)
				err := client.wait(t, 2*time.Minute)
				if err == nil || !strings.Contains(client.err.String(), "Resource temporarily unavailable") {
					t.Fatalf("forced into the bypass, the client ended with %v: %s; want EAGAIN from an interrupted read", err, client.err.String())
				}
				t.Logf("forced into the bypass: %s", lastLine(client.err.String()))
				return
			}
			out := run(t, cli, 2*time.Minute, "python3", args...)
			close(stop)
			if err := server.wait(t, time.Minute); err != nil {
				t.Fatalf("server: %v\n%s", err, server.err.String())
			}
			if !strings.Contains(out, "ok") {
				t.Fatalf("client: %s", out)
			}
			d := testutil.Delta(before, in.Counters())
			t.Logf("%s", nonzero(d))
			if tt.nonblocking {
				mustEqual(t, d, "fallback_blocking", 1)
				mustAtLeast(t, d, "conns_bypassed", conns-1)
				mustCarry(t, d, 2*(conns-1)*size)
				return
			}
			if tt.bypassed {
				mustAtLeast(t, d, "conns_bypassed", conns)
				mustAtLeast(t, d, "blocking_quiet", conns)
				mustCarry(t, d, 2*conns*size)
				mustEqual(t, d, "fallback_blocking", 0)
				return
			}
			mustAtLeast(t, d, "fallback_blocking", conns)
			mustEqual(t, d, "redirect_msgs", 0)
		})
	}
}
