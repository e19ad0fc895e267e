package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/pcap"
	"github.com/socklane/socklane/internal/testbed"
	"github.com/socklane/socklane/internal/testutil"
)

// TestEvents: the event stream shows a bypassed connection's establish,
// bypass and close in order, with the close carrying its byte totals, and
// service selections.
func TestEvents(t *testing.T) {
	b := testutil.Bed(t)
	in := testutil.NewInstance(t)
	srv, cli := testutil.Pod(t, b, "server"), testutil.Pod(t, b, "client")
	in.Attach(srv, cli)
	echoService(t, in, srv, 7300, "198.19.0.30", "  - name: empty\n    vips: [198.19.0.31]\n    ports: [{port: 80}]\n")

	cmd, stdout, errText := background(t, in, "reading events", "events", "-o", "json", "--duration", "30s")
	events := make(chan map[string]any, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var e map[string]any
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				events <- e
			}
		}
		close(events)
	}()
	// Three 100-byte round trips through the VIP, then close; and a
	// connect to a service without backends.
	run := func(p *testbed.Pod, args ...string) {
		t.Helper()
		c, err := p.Command(in.Bin, args...)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.Run()
	}
	run(cli, "peer", "pingpong", "198.19.0.30:80", "--size", "100", "--count", "3", "--warmup", "0")
	run(cli, "peer", "lbprobe", "198.19.0.31:80", "--count", "1")

	var got []map[string]any
	deadline := time.After(15 * time.Second)
	closes := 0
	for closes < 2 || !hasType(got, "lb_refused") {
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatalf("event stream ended: %s\nevents: %v", errText.String(), got)
			}
			if e["type"] == "lost" {
				t.Fatalf("events lost: %v", e)
			}
			if e["dst"] == fmt.Sprintf("%s:7300", srv.IPv4) || strings.HasPrefix(e["type"].(string), "lb_") {
				got = append(got, e)
				if e["type"] == "closed" {
					closes++
				}
			}
		case <-deadline:
			t.Fatalf("want establish, bypass, two closes and an lb_refused; got %v", got)
		}
	}
	_ = cmd.Process.Kill()
	var order []string
	for _, e := range got {
		order = append(order, e["type"].(string))
	}
	want := []string{"lb_select", "established", "bypass", "closed", "closed", "lb_refused"}
	if strings.Join(order, ",") != strings.Join(want, ",") {
		t.Errorf("events in order %v, want %v", order, want)
	}
	closed := 0
	for _, e := range got {
		switch e["type"] {
		case "closed":
			// Each end's own direction is exact when it closes (its
			// open verdict window is counted then); the last close has
			// both.
			closed++
			b := e["bytes"].([]any)
			own := 0
			if e["role"] == "server" {
				own = 1
			}
			if b[own].(float64) != 300 || (closed == 2 && b[1-own].(float64) != 300) {
				t.Errorf("%s close: totals %v, want 300 bytes each way", e["role"], b)
			}
		case "lb_select":
			if e["src"] != "198.19.0.30:80" || e["dst"] != fmt.Sprintf("%s:7300", srv.IPv4) {
				t.Errorf("lb_select %v", e)
			}
		}
	}
}

// TestCaptureStream: a capture started on a connection that already
// streams large sends, which redirect without a verdict's reads
// (redirect_fast), records every send from its first: the client's
// segments in the file follow each other with no byte missing.
func TestCaptureStream(t *testing.T) {
	b := testutil.Bed(t)
	in := testutil.NewInstance(t)
	srv, cli := testutil.Pod(t, b, "server"), testutil.Pod(t, b, "client")
	in.Attach(srv, cli)
	start(t, srv, in.Bin, "peer", "sink", "0.0.0.0:7302")
	waitPort(t, srv, "0.0.0.0:7302")
	before := in.Counters()
	// 16 KiB sends, 200 us apart: within the capture's ring and rate.
	stream := start(t, cli, in.Bin, "peer", "stream", fmt.Sprintf("%s:7302", srv.IPv4), "--size", "16384",
		"--count", "0", "--duration", "20s", "--interval", "200us")
	deadline := time.Now().Add(10 * time.Second)
	for testutil.Delta(before, in.Counters())["redirect_fast"] < 100 {
		if time.Now().After(deadline) {
			t.Fatalf("the stream's sends took no fast verdicts: %v", testutil.Delta(before, in.Counters()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	began := time.Now()
	file := filepath.Join(t.TempDir(), "stream.pcap")
	const count = 300
	cmd, _, errText := background(t, in, "capturing", "capture", "-w", file, "--port", "7302", "--count", fmt.Sprint(count),
		"--rate", "0", "--snap", "64", "--duration", "30s")
	waitCapture(t, cmd, errText, count, 30*time.Second)
	t.Logf("%d messages captured in %v", count, time.Since(began))
	_ = stream.cmd.Process.Kill()
	pkts := readCapture(t, file)
	var sent []pcap.Packet
	for _, p := range pkts {
		if p.Src.Addr() == cli.IPv4 && p.Len > 0 {
			sent = append(sent, p)
		}
	}
	if len(sent) < count/2 {
		t.Fatalf("%d of %d captured messages from the client, want most", len(sent), len(pkts))
	}
	sort.Slice(sent, func(i, j int) bool { return int32(sent[i].Seq-sent[0].Seq) < int32(sent[j].Seq-sent[0].Seq) })
	for i := 1; i < len(sent); i++ {
		if want := sent[i-1].Seq + uint32(sent[i-1].Len); sent[i].Seq != want {
			t.Fatalf("message %d of the client's starts at sequence %d, want %d (the previous one's end): a send went uncaptured", i, sent[i].Seq, want)
		}
	}
}

// waitCapture waits for a `socklane capture --count n` to stop and checks
// its summary: n messages, none missed.
func waitCapture(t *testing.T, cmd *exec.Cmd, errText *lockedBuffer, n int, timeout time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("capture: %v: %s", err, errText.String())
		}
	case <-time.After(timeout):
		t.Fatalf("capture did not stop after %d messages: %s", n, errText.String())
	}
	if !strings.Contains(errText.String(), fmt.Sprintf("captured %d messages", n)) || !strings.Contains(errText.String(), "missed 0 (ring buffer full), 0 (over --rate)") {
		t.Fatalf("capture summary: %s", errText.String())
	}
}

// readCapture reads a capture file's packets.
func readCapture(t *testing.T, file string) []pcap.Packet {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	pkts, err := pcap.Read(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	return pkts
}

func hasType(evs []map[string]any, typ string) bool {
	for _, e := range evs {
		if e["type"] == typ {
			return true
		}
	}
	return false
}

// TestCapture records a known request and reply over a bypassed
// connection and reads the file back with tcpdump and with the Go reader.
func TestCapture(t *testing.T) {
	tcpdump := testutil.RequireCommand(t, "tcpdump")
	b := testutil.Bed(t)
	in := testutil.NewInstance(t)
	srv, cli := testutil.Pod(t, b, "server"), testutil.Pod(t, b, "client")
	in.Attach(srv, cli)
	const request, reply = "REQUEST-FROM-CLIENT-0123456789", "REPLY-FROM-SERVER"
	start(t, srv, in.Bin, "peer", "whoami", "0.0.0.0:7301", "--label", reply)
	waitPort(t, srv, "0.0.0.0:7301")
	file := filepath.Join(t.TempDir(), "bypass.pcap")
	// An existing world-readable file: the capture (other pods' payloads)
	// must end up readable by its owner only.
	if err := os.WriteFile(file, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := in.Counters()
	cmd, _, errText := background(t, in, "capturing", "capture", "-w", file, "--port", "7301", "--count", "2", "--duration", "30s")
	c, err := cli.Command(in.Bin, "peer", "request", fmt.Sprintf("%s:7301", srv.IPv4), "--data", request)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := c.CombinedOutput(); err != nil || !strings.Contains(string(out), reply) {
		t.Fatalf("peer request: %v: %s", err, out)
	}
	waitCapture(t, cmd, errText, 2, 15*time.Second)
	d := testutil.Delta(before, in.Counters())
	mustEqual(t, d, "captured", 2)
	mustAtLeast(t, d, "redirect_msgs", 2)

	if st, err := os.Stat(file); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("capture file mode: %v (%v), want 0600", st.Mode().Perm(), err)
	}
	pkts := readCapture(t, file)
	if len(pkts) != 2 {
		t.Fatalf("%d packets in the capture, want 2", len(pkts))
	}
	byPayload := map[string]pcap.Packet{}
	for _, p := range pkts {
		byPayload[string(p.Payload)] = p
	}
	q, okq := byPayload[request]
	r, okr := byPayload[reply]
	if !okq || !okr {
		t.Fatalf("payloads %q and %q, want %q and %q", pkts[0].Payload, pkts[1].Payload, request, reply)
	}
	if q.Dst.String() != fmt.Sprintf("%s:7301", srv.IPv4) || q.Src.Addr() != cli.IPv4 || r.Src != q.Dst || r.Dst != q.Src {
		t.Errorf("addresses: request %s -> %s, reply %s -> %s", q.Src, q.Dst, r.Src, r.Dst)
	}
	if !q.ChecksumOK || !r.ChecksumOK {
		t.Errorf("TCP checksums do not verify")
	}
	out, err := exec.Command(tcpdump, "-nn", "-A", "-r", file).CombinedOutput()
	if err != nil {
		t.Fatalf("tcpdump -r: %v\n%s", err, out)
	}
	for _, want := range []string{
		fmt.Sprintf("%s.%d > %s.7301", cli.IPv4, q.Src.Port(), srv.IPv4),
		fmt.Sprintf("%s.7301 > %s.%d", srv.IPv4, cli.IPv4, q.Src.Port()),
		request, reply,
		fmt.Sprintf("length %d", len(request)), fmt.Sprintf("length %d", len(reply)),
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("tcpdump -r output lacks %q:\n%s", want, out)
		}
	}
}

// TestTop: the batch view of `socklane top` shows a busy bypassed
// connection with its byte rate, and a service choosing backends.
func TestTop(t *testing.T) {
	b := testutil.Bed(t)
	in := testutil.NewInstance(t)
	srv, cli := testutil.Pod(t, b, "server"), testutil.Pod(t, b, "client")
	in.Attach(srv, cli)
	echoService(t, in, srv, 7302, "198.19.0.32", "")
	pp := start(t, cli, in.Bin, "peer", "pingpong", fmt.Sprintf("%s:7302", srv.IPv4), "--size", "1000", "--count", "5000000", "--warmup", "0")
	t.Cleanup(func() { _ = pp.cmd.Process.Kill() })
	// The short connections go to the same server: once the datapath has
	// learned that they are brief, a long connection that starts after
	// them stays on TCP (15 in 16). The busy one joins first.
	waitFor(t, func() bool { return in.Sockets() >= 2 })
	short := start(t, cli, in.Bin, "peer", "connects", "198.19.0.32:80", "--size", "64", "--count", "200000")
	t.Cleanup(func() { _ = short.cmd.Process.Kill() })
	time.Sleep(200 * time.Millisecond)

	out := in.MustRun("top", "--batch", "--iterations", "3", "--interval", "300ms", "-o", "json")
	type frame struct {
		Conns []struct {
			Server   string
			Path     string
			Up, Down float64
		}
		Services []struct {
			Service  string
			Selected float64
		}
	}
	busy, balanced := false, false
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var fr frame
		if err := json.Unmarshal([]byte(line), &fr); err != nil {
			t.Fatalf("top -o json line %q: %v", line, err)
		}
		if len(fr.Conns) > 0 && fr.Conns[0].Server == fmt.Sprintf("%s:7302", srv.IPv4) && fr.Conns[0].Path == "bypass" && fr.Conns[0].Up > 0 && fr.Conns[0].Down > 0 {
			busy = true
		}
		for _, s := range fr.Services {
			if s.Service == "default/echo" && s.Selected > 0 {
				balanced = true
			}
		}
	}
	if !busy || !balanced {
		t.Errorf("top did not show the busy bypassed connection first (%v) or the service choosing backends (%v):\n%s", busy, balanced, out)
	}
	text := in.MustRun("top", "--batch", "--iterations", "1", "--interval", "200ms")
	for _, want := range []string{"CLIENT", "SERVICE", "default/echo", "bypassed sockets"} {
		if !strings.Contains(text, want) {
			t.Errorf("top text lacks %q:\n%s", want, text)
		}
	}
}

// echoService starts an echo server on port in srv and serves it as
// service "echo" on vip:80, with more services (YAML list items) if given.
func echoService(t *testing.T, in *testutil.Instance, srv *testbed.Pod, port int, vip, more string) {
	t.Helper()
	listen := fmt.Sprintf("0.0.0.0:%d", port)
	start(t, srv, in.Bin, "peer", "echo", listen)
	waitPort(t, srv, listen)
	f := filepath.Join(t.TempDir(), "svc.yaml")
	yaml := fmt.Sprintf("services:\n  - name: echo\n    vips: [%s]\n    ports: [{port: 80, targetPort: %d}]\n    backends: [{ip: %s}]\n%s", vip, port, srv.IPv4, more)
	if err := os.WriteFile(f, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	in.MustRun("svc", "apply", "-f", f)
}
