package sockdiag

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/testutil"
	"golang.org/x/sys/unix"
)

func cookieOf(t *testing.T, c syscall.Conn) uint64 {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v uint64
	var serr error
	if err := rc.Control(func(fd uintptr) { v, serr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_COOKIE) }); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatalf("SO_COOKIE: %v", serr)
	}
	return v
}

type connPair struct {
	client net.Conn
	proto  uint8
}

func tcpPair(t *testing.T, network, addr string) connPair {
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	c, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return connPair{c, unix.IPPROTO_TCP}
}

func udpPair(t *testing.T, network, addr string) connPair {
	srv, err := net.ListenPacket(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial(network, srv.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); srv.Close() })
	return connPair{c, unix.IPPROTO_UDP}
}

// TestDumpAndDestroy finds real sockets by cookie and destroys them: the
// owner's next read fails with ECONNABORTED.
func TestDumpAndDestroy(t *testing.T) {
	testutil.RequireRoot(t) // SOCK_DESTROY needs CAP_NET_ADMIN
	cases := []struct {
		name   string
		pair   func(t *testing.T) connPair
		family uint8
	}{
		{"tcp4", func(t *testing.T) connPair { return tcpPair(t, "tcp4", "127.0.0.1:0") }, unix.AF_INET},
		{"tcp6", func(t *testing.T) connPair { return tcpPair(t, "tcp6", "[::1]:0") }, unix.AF_INET6},
		{"udp4 connected", func(t *testing.T) connPair { return udpPair(t, "udp4", "127.0.0.1:0") }, unix.AF_INET},
		{"udp6 connected", func(t *testing.T) connPair { return udpPair(t, "udp6", "[::1]:0") }, unix.AF_INET6},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.pair(t)
			cookie := cookieOf(t, p.client.(syscall.Conn))
			c, err := Open()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			socks, err := c.Dump(tc.family, p.proto)
			if err != nil {
				t.Fatal(err)
			}
			var found *Socket
			for i := range socks {
				if socks[i].ID.Cookie == cookie {
					found = &socks[i]
				}
			}
			if found == nil {
				t.Fatalf("cookie %d not among %d dumped sockets", cookie, len(socks))
			}
			if got, want := found.Local().String(), p.client.LocalAddr().String(); got != want {
				t.Errorf("local address %s, want %s", got, want)
			}
			if got, want := found.Remote().String(), p.client.RemoteAddr().String(); got != want {
				t.Errorf("remote address %s, want %s", got, want)
			}
			if err := c.Destroy(*found); err != nil {
				t.Fatal(err)
			}
			if err := p.client.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
				t.Fatal(err)
			}
			_, err = p.client.Read(make([]byte, 16))
			if !errors.Is(err, syscall.ECONNABORTED) {
				t.Errorf("read after destroy: %v, want ECONNABORTED", err)
			}
			if err := c.Destroy(*found); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("second destroy: %v, want not-exist", err)
			}
		})
	}
}

// TestDestroyAllAcrossNamespaces destroys by cookie and namespace cookie,
// as the agent does, and ignores targets that are already gone.
func TestDestroyAllAcrossNamespaces(t *testing.T) {
	testutil.RequireRoot(t)
	p := tcpPair(t, "tcp4", "127.0.0.1:0")
	cookie := cookieOf(t, p.client.(syscall.Conn))
	c, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := c.NetnsCookie()
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	n, err := DestroyAll([]Target{
		{Cookie: cookie, Netns: nc, Protocol: unix.IPPROTO_TCP},
		{Cookie: cookie + 1<<40, Netns: nc, Protocol: unix.IPPROTO_TCP}, // no such socket
		{Cookie: 1, Netns: nc + 1<<40, Protocol: unix.IPPROTO_UDP},      // no such namespace
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("destroyed %d sockets, want 1", n)
	}
	if err := p.client.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.client.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNABORTED) {
		t.Errorf("read after destroy: %v, want ECONNABORTED", err)
	}
}

func TestParse(t *testing.T) {
	id := ID{SrcPort: 8080, DstPort: 443, If: 3, Cookie: 0x1122334455667788}
	copy(id.Src[:], []byte{198, 18, 0, 1})
	copy(id.Dst[:], []byte{198, 19, 0, 7})
	msg := func(typ uint16, body []byte) []byte {
		b := make([]byte, sizeofNlmsghdr+len(body))
		b[0] = byte(len(b))
		b[4] = byte(typ)
		copy(b[sizeofNlmsghdr:], body)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	diag := make([]byte, sizeofDiagMsg)
	diag[0], diag[1] = unix.AF_INET, 1
	putID(diag[4:], id)
	errMsg := func(e int32) []byte {
		b := make([]byte, 20)
		u := uint32(-e)
		b[0], b[1], b[2], b[3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
		return msg(unix.NLMSG_ERROR, b)
	}
	cases := []struct {
		name    string
		in      []byte
		socks   int
		wantErr error
	}{
		{"one socket", msg(unix.SOCK_DIAG_BY_FAMILY, diag), 1, nil},
		{"two then done", append(append(msg(unix.SOCK_DIAG_BY_FAMILY, diag), msg(unix.SOCK_DIAG_BY_FAMILY, diag)...), msg(unix.NLMSG_DONE, make([]byte, 4))...), 2, errDone},
		{"ack", errMsg(0), 0, errDone},
		{"error", errMsg(int32(syscall.ENOENT)), 0, syscall.ENOENT},
		{"truncated header", []byte{1, 2, 3}, 0, nil},
		{"short diag", msg(unix.SOCK_DIAG_BY_FAMILY, diag[:10]), 0, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			socks, err := parse(tc.in, unix.IPPROTO_TCP)
			if len(socks) != tc.socks {
				t.Errorf("%d sockets, want %d", len(socks), tc.socks)
			}
			switch {
			case tc.wantErr == nil && tc.name != "one socket" && err == nil:
				t.Errorf("no error for malformed input")
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Errorf("error %v, want %v", err, tc.wantErr)
			}
			if tc.socks > 0 {
				s := socks[0]
				if s.ID != id || s.Local().String() != "198.18.0.1:8080" || s.Remote().String() != "198.19.0.7:443" {
					t.Errorf("parsed %+v (%s -> %s)", s.ID, s.Local(), s.Remote())
				}
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	diag := make([]byte, sizeofNlmsghdr+sizeofDiagMsg)
	diag[0] = byte(len(diag))
	diag[4] = unix.SOCK_DIAG_BY_FAMILY
	f.Add(diag)
	f.Add([]byte{16, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0, 0, 2, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		socks, _ := parse(b, unix.IPPROTO_UDP)
		if len(socks)*(sizeofNlmsghdr+sizeofDiagMsg) > len(b) {
			t.Fatalf("%d sockets from %d bytes", len(socks), len(b))
		}
	})
}

// TestDestroyTimeWait leaves TIME_WAIT sockets towards two listeners and
// removes only those the match accepts.
func TestDestroyTimeWait(t *testing.T) {
	testutil.RequireRoot(t)
	const conns = 10
	var ports []uint16
	for range 2 {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		ports = append(ports, uint16(ln.Addr().(*net.TCPAddr).Port))
		for range conns {
			c, err := net.Dial("tcp4", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			s, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			// The client closes first and keeps the TIME_WAIT.
			c.Close()
			if _, err := s.Read(make([]byte, 1)); err == nil {
				t.Fatal("server read data, want EOF")
			}
			s.Close()
		}
	}
	c, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	to := func(port uint16) func(netip.AddrPort) bool {
		return func(a netip.AddrPort) bool { return a.Port() == port }
	}
	count := func(port uint16) int {
		socks, err := c.Dump(unix.AF_INET, unix.IPPROTO_TCP)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, s := range socks {
			if s.State == TCPTimeWait && s.Remote().Port() == port {
				n++
			}
		}
		return n
	}
	// The last FIN's ACK may still be on its way.
	deadline := time.Now().Add(5 * time.Second)
	for count(ports[1]) < conns && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	for _, p := range ports {
		if n := count(p); n != conns {
			t.Fatalf("%d TIME_WAIT sockets towards port %d, want %d", n, p, conns)
		}
	}
	n, err := c.DestroyTimeWait(to(ports[0]))
	if err != nil {
		t.Fatal(err)
	}
	if n != conns || count(ports[0]) != 0 {
		t.Errorf("removed %d, %d left towards port %d; want %d removed, none left", n, count(ports[0]), ports[0], conns)
	}
	if left := count(ports[1]); left != conns {
		t.Errorf("%d TIME_WAIT sockets towards port %d after removing port %d's, want %d untouched", left, ports[1], ports[0], conns)
	}
	if _, err := c.DestroyTimeWait(to(ports[1])); err != nil {
		t.Fatal(err)
	}
}
