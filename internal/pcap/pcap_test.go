package pcap

import (
	"bytes"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/testutil"
)

func conversation(client, server string) []Message {
	c, s := netip.MustParseAddrPort(client), netip.MustParseAddrPort(server)
	t0 := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)
	req := []byte("GET /hello HTTP/1.1\r\nHost: web\r\n\r\n")
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
	return []Message{
		{Time: t0, Src: c, Dst: s, Conn: 7, Dir: 0, Offset: 0, Len: uint32(len(req)), Payload: req},
		{Time: t0.Add(time.Millisecond), Src: s, Dst: c, Conn: 7, Dir: 1, Offset: 0, Len: uint32(len(resp)), Payload: resp},
		// A large message of which only the head was captured.
		{Time: t0.Add(2 * time.Millisecond), Src: c, Dst: s, Conn: 7, Dir: 0, Offset: uint64(len(req)), Len: 100000, Payload: []byte("head")},
	}
}

func roundTrip(t *testing.T, msgs []Message) []Packet {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := w.Write(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	pkts, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	return pkts
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct{ name, client, server string }{
		{"ipv4", "198.18.1.2:40000", "198.18.1.3:7000"},
		{"ipv6", "[2001:db8::2]:40000", "[2001:db8::3]:7000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs := conversation(tc.client, tc.server)
			pkts := roundTrip(t, msgs)
			// The 100,000-byte message needs two IPv4-sized segments.
			if len(pkts) != 4 {
				t.Fatalf("%d packets, want 4", len(pkts))
			}
			req, resp, big1, big2 := pkts[0], pkts[1], pkts[2], pkts[3]
			if req.Src != msgs[0].Src || req.Dst != msgs[0].Dst || !bytes.Equal(req.Payload, msgs[0].Payload) || !req.ChecksumOK {
				t.Errorf("request read back as %+v", req)
			}
			if resp.Src != msgs[1].Src || !bytes.Equal(resp.Payload, msgs[1].Payload) || !resp.ChecksumOK {
				t.Errorf("response read back as %+v", resp)
			}
			// Sequence numbers follow the byte stream; acks the other way.
			if big1.Seq != req.Seq+uint32(len(msgs[0].Payload)) {
				t.Errorf("second client segment seq %d, want %d", big1.Seq, req.Seq+uint32(len(msgs[0].Payload)))
			}
			if big1.Ack != resp.Seq+uint32(len(msgs[1].Payload)) {
				t.Errorf("client ack %d, want %d (after the response)", big1.Ack, resp.Seq+uint32(len(msgs[1].Payload)))
			}
			if big2.Seq != big1.Seq+uint32(big1.Len) || big1.Len+big2.Len != 100000 {
				t.Errorf("split segments: seq %d+%d, %d; lengths %d+%d", big1.Seq, big1.Len, big2.Seq, big1.Len, big2.Len)
			}
			if string(big1.Payload) != "head" || len(big2.Payload) != 0 || big1.ChecksumOK {
				t.Errorf("partial capture: payloads %q %q, checksum ok %v", big1.Payload, big2.Payload, big1.ChecksumOK)
			}
			if !req.Time.Equal(msgs[0].Time) {
				t.Errorf("time %v, want %v", req.Time, msgs[0].Time)
			}
		})
	}
}

// TestTcpdumpReads: tcpdump reads the file and shows the conversation.
func TestTcpdumpReads(t *testing.T) {
	tcpdump := testutil.RequireCommand(t, "tcpdump")
	path := filepath.Join(t.TempDir(), "c.pcap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range conversation("198.18.1.2:40000", "198.18.1.3:7000")[:2] {
		if err := w.Write(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	out, err := exec.Command(tcpdump, "-nn", "-vv", "-A", "-r", path).CombinedOutput()
	if err != nil {
		t.Fatalf("tcpdump -r: %v\n%s", err, out)
	}
	s := string(out)
	for _, want := range []string{"198.18.1.2.40000 > 198.18.1.3.7000", "198.18.1.3.7000 > 198.18.1.2.40000", "GET /hello", "200 OK", "cksum 0x"} {
		if !strings.Contains(s, want) {
			t.Errorf("tcpdump output lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "incorrect") || strings.Contains(s, "bad cksum") {
		t.Errorf("tcpdump finds a bad checksum:\n%s", s)
	}
}

func FuzzRead(f *testing.F) {
	var buf bytes.Buffer
	w, _ := NewWriter(&buf)
	for _, m := range conversation("198.18.1.2:40000", "198.18.1.3:7000") {
		_ = w.Write(m)
	}
	_ = w.Flush()
	f.Add(buf.Bytes())
	f.Add([]byte{0x4d, 0x3c, 0xb2, 0xa1})
	f.Fuzz(func(t *testing.T, b []byte) {
		pkts, _ := Read(bytes.NewReader(b))
		for _, p := range pkts {
			if len(p.Payload) > p.Len+65535 {
				t.Fatalf("payload %d of %d", len(p.Payload), p.Len)
			}
		}
	})
}
