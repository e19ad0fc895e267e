package peer

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// HoldEvent is one line of Hold's output.
type HoldEvent struct {
	Event   string `json:"event"` // "open", "ready" (all open) or "closed"
	Index   int    `json:"index"`
	Backend string `json:"backend,omitempty"` // the whoami label, or the DNS answer
	Error   string `json:"error,omitempty"`   // errno name of the read that ended the socket
}

// Hold opens count connected sockets to target and learns each one's
// backend from its first reply: mode "tcp" and "udp" talk to whoami
// servers, "dns" sends a DNS query for name over connected UDP and takes
// the A record of the answer. It writes an "open" line per socket and a
// "ready" line, then reads every socket until it fails and writes a
// "closed" line for each. It returns when all have closed or ctx ends.
func Hold(ctx context.Context, w io.Writer, mode, target, name string, count int) error {
	var mu sync.Mutex
	enc := json.NewEncoder(w)
	emit := func(e HoldEvent) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(e)
	}
	network := "udp"
	if mode == "tcp" {
		network = "tcp"
	} else if mode != "udp" && mode != "dns" {
		return fmt.Errorf("mode %q: want tcp, udp or dns", mode)
	}
	conns := make([]net.Conn, 0, count)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range count {
		d := net.Dialer{Timeout: 5 * time.Second}
		c, err := d.DialContext(ctx, network, target)
		if err != nil {
			return fmt.Errorf("connecting socket %d: %w", i, err)
		}
		conns = append(conns, c)
		backend, err := firstReply(c, mode, name)
		if err != nil {
			return fmt.Errorf("socket %d: %w", i, err)
		}
		emit(HoldEvent{Event: "open", Index: i, Backend: backend})
	}
	emit(HoldEvent{Event: "ready"})
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			_ = c.SetReadDeadline(time.Time{})
			buf := make([]byte, 512)
			for {
				_, err := c.Read(buf)
				if err != nil {
					emit(HoldEvent{Event: "closed", Index: i, Error: errnoName(err)})
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return nil
}

func errnoName(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return unix.ErrnoName(errno)
	}
	if errors.Is(err, io.EOF) {
		return "EOF"
	}
	return err.Error()
}

func firstReply(c net.Conn, mode, name string) (string, error) {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2048)
	switch mode {
	case "udp":
		if _, err := c.Write([]byte("who")); err != nil {
			return "", err
		}
	case "dns":
		id := uint16(rand.Uint32())
		if _, err := c.Write(dnsQueryA(id, name)); err != nil {
			return "", err
		}
		n, err := c.Read(buf)
		if err != nil {
			return "", err
		}
		a, err := dnsAnswerA(buf[:n], id)
		if err != nil {
			return "", err
		}
		return a.String(), nil
	}
	n, err := c.Read(buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// dnsQueryA builds a recursive query for name's A record.
func dnsQueryA(id uint16, name string) []byte {
	b := binary.BigEndian.AppendUint16(nil, id)
	b = append(b, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0) // RD; one question
	for _, l := range strings.Split(strings.TrimSuffix(name, "."), ".") {
		b = append(b, byte(len(l)))
		b = append(b, l...)
	}
	return append(b, 0, 0, 1, 0, 1) // root, type A, class IN
}

// dnsAnswerA returns the first A record of the answer to query id.
func dnsAnswerA(m []byte, id uint16) (netip.Addr, error) {
	if len(m) < 12 {
		return netip.Addr{}, errors.New("DNS reply shorter than its header")
	}
	if binary.BigEndian.Uint16(m) != id {
		return netip.Addr{}, errors.New("DNS reply to another query")
	}
	if rcode := m[3] & 0x0f; rcode != 0 {
		return netip.Addr{}, fmt.Errorf("DNS reply code %d", rcode)
	}
	qd, an := binary.BigEndian.Uint16(m[4:]), binary.BigEndian.Uint16(m[6:])
	off := 12
	skipName := func() error {
		for off < len(m) {
			l := int(m[off])
			switch {
			case l == 0:
				off++
				return nil
			case l&0xc0 == 0xc0: // compression pointer ends the name
				off += 2
				return nil
			default:
				off += 1 + l
			}
		}
		return errors.New("DNS name runs past the message")
	}
	for range qd {
		if err := skipName(); err != nil {
			return netip.Addr{}, err
		}
		off += 4
	}
	for range an {
		if err := skipName(); err != nil {
			return netip.Addr{}, err
		}
		if off+10 > len(m) {
			return netip.Addr{}, errors.New("DNS record truncated")
		}
		typ, rdlen := binary.BigEndian.Uint16(m[off:]), int(binary.BigEndian.Uint16(m[off+8:]))
		off += 10
		if off+rdlen > len(m) {
			return netip.Addr{}, errors.New("DNS record data truncated")
		}
		if typ == 1 && rdlen == 4 {
			return netip.AddrFrom4([4]byte(m[off : off+4])), nil
		}
		off += rdlen
	}
	return netip.Addr{}, errors.New("no A record in the DNS answer")
}
