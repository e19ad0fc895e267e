package procsock

import (
	"net"
	"os"
	"strings"
	"testing"
)

func TestParseListening(t *testing.T) {
	const table = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:A1B2 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 20 4 30 10 -1
   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 0 1 0000000000000000 100 0 0 10 0
`
	got, err := ParseListening(strings.NewReader(table))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Port != 8080 || got[0].Inode != 4242 {
		t.Fatalf("got %+v, want one listener on 8080 with inode 4242 (established and inode-0 lines skipped)", got)
	}
}

func FuzzParseListening(f *testing.F) {
	f.Add("header\n 0: 00000000:1F90 00000000:0000 0A 0:0 0:0 0 0 0 4242 1\n")
	f.Fuzz(func(t *testing.T, s string) {
		ls, err := ParseListening(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, l := range ls {
			if l.Inode == 0 {
				t.Fatalf("listener with inode 0 from %q", s)
			}
		}
	})
}

// TestOfPid finds this process's own listeners, blocking or not.
func TestOfPid(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // Go: non-blocking
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	ls, err := OfPid(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if l.Port == port {
			if l.Blocking {
				t.Errorf("Go's listener reported blocking")
			}
			return
		}
	}
	t.Fatalf("listener on %d not found in %+v", port, ls)
}

// TestParseSigCgt: the signals a process handles, from its status file.
func TestParseSigCgt(t *testing.T) {
	status := "Name:\tpython3\nSigBlk:\t0000000000000000\nSigIgn:\t0000000001001000\nSigCgt:\t0000000000004002\nCapInh:\t0\n"
	if v, ok := ParseSigCgt(strings.NewReader(status)); !ok || v != 0x4002 {
		t.Errorf("SigCgt %#x, %v; want 0x4002", v, ok)
	}
	if _, ok := ParseSigCgt(strings.NewReader("Name:\tx\n")); ok {
		t.Error("a status without SigCgt parsed")
	}
	if got := caughtSignals("/nonexistent/status"); got != ^uint64(0) {
		t.Errorf("an unreadable status: %#x, want every signal", got)
	}
}
