package kerneltest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/datapath"
	"golang.org/x/sys/unix"
)

// runFinRole runs the roles of TestFinAlone; ok is false for any other.
func runFinRole(role string, args []string) (ok bool, err error) {
	switch role {
	case "close-at-once": // ADDR: accept and close every connection, sending nothing
		ln, err := net.Listen("tcp", args[0])
		if err != nil {
			return true, err
		}
		fmt.Println("listening")
		for {
			c, err := ln.Accept()
			if err != nil {
				return true, err
			}
			c.Close()
		}
	case "hold-fin": // ADDR: connect, read to the server's FIN, say "held", close once stdin ends
		c, err := net.DialTimeout("tcp", args[0], 10*time.Second)
		if err != nil {
			return true, err
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := c.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
			return true, fmt.Errorf("reading to the server's FIN: %d bytes, %v", n, err)
		}
		fmt.Println("held")
		_, err = io.Copy(io.Discard, bufio.NewReader(os.Stdin))
		return true, err
	}
	return false, nil
}

// TestFinAlone: a socket of the valve's map that TCP delivers nothing but
// its peer's FIN (a short connection's client, once its server closed)
// runs the stream verdict for the FIN's empty segment, which has no byte to
// cut and none after it: sl_skb follows no sequence for it (no entry in
// sl_skb_seqs, no hash insert on a short connection's path). The evidence:
// the kernel's run count of sl_skb, and the map, while the client holds
// the half-closed connection.
func TestFinAlone(t *testing.T) {
	// Joined with the verdict: a calm connection given it late would
	// not run sl_skb at all.
	n := newNode(t, func(s *datapath.Settings) { s.LateVerdict = datapath.ModeOff })
	st, err := n.dp.Settings()
	if err != nil {
		t.Fatal(err)
	}
	if !st.BacklogValve.On() {
		t.Skipf("the valve does not run on %s: no socket map has a stream verdict", kernel())
	}
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Fatalf("turning on the BPF run-time statistics: %v", err)
	}
	defer stats.Close()
	var skb *ebpf.Program
	for _, p := range n.dp.Programs() {
		if info, err := p.Info(); err == nil && info.Name == "sl_skb" {
			skb = p
		}
	}
	if skb == nil {
		t.Fatal("no sl_skb among the datapath's programs")
	}
	runs := func() uint64 {
		s, err := skb.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return s.RunCount
	}

	const addr = "127.0.0.1:7741"
	n.server("close-at-once", addr)
	before, ran := n.counters(), runs()
	cmd, out := n.holdRole("hold-fin", addr)
	inMaps, err := n.dp.SocketsByMap()
	if err != nil {
		t.Fatal(err)
	}
	seqs, err := n.dp.SkbSeqs()
	if err != nil {
		t.Fatal(err)
	}
	d := delta(before, n.counters())
	verdicts := runs() - ran
	t.Logf("the client half-closed by its server: in the maps %+v, sl_skb ran %d times, sl_skb_seqs holds %d; %v", inMaps, verdicts, seqs, d)
	if d["conns_bypassed"] != 1 || inMaps.Valve != 1 {
		t.Fatalf("the connection: %d bypassed, %d sockets in the valve's map; want 1 and the client's", d["conns_bypassed"], inMaps.Valve)
	}
	if verdicts == 0 {
		t.Fatal("sl_skb never ran: the FIN did not reach the stream verdict, so this test proves nothing")
	}
	if seqs != 0 {
		t.Errorf("sl_skb_seqs follows %d sockets, want none: the FIN's empty segment made an entry", seqs)
	}
	out.w.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("hold-fin: %v: %s", err, out.String())
	}
}
