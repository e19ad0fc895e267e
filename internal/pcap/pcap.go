// Package pcap writes captured bypassed messages as a pcap file of
// synthesized Ethernet/IP/TCP segments carrying the connections' real
// addresses and ports and consistent sequence numbers, so that tcpdump and
// Wireshark show a bypassed conversation as if it had crossed the stack;
// and reads such files back.
package pcap

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/netip"
	"time"
)

const (
	magicNanos  = 0xa1b23c4d // nanosecond timestamps
	magicMicros = 0xa1b2c3d4
	linkEther   = 1
	snapLen     = 65535
	ethLen      = 14
	ip4Len      = 20
	ip6Len      = 40
	tcpLen      = 20
	// The largest TCP payload of one synthesized IPv4 segment.
	maxSegment = 65535 - ip4Len - tcpLen
)

// Message is one message of a TCP byte stream.
type Message struct {
	Time     time.Time
	Src, Dst netip.AddrPort
	Conn     uint64 // identity of the connection (any value stable per connection)
	Dir      uint8  // 0: client to server, 1: server to client
	Offset   uint64 // stream offset of its first byte in its direction
	Len      uint32 // its length
	Payload  []byte // its first bytes (at most Len)
}

type connState struct {
	isn  [2]uint32
	next [2]uint64 // stream offset after the last byte seen, per direction
}

// Writer writes messages as pcap records.
type Writer struct {
	w     *bufio.Writer
	conns map[uint64]*connState
	ipID  uint16
}

// NewWriter writes the file header.
func NewWriter(w io.Writer) (*Writer, error) {
	bw := bufio.NewWriter(w)
	var h [24]byte
	binary.LittleEndian.PutUint32(h[0:], magicNanos)
	binary.LittleEndian.PutUint16(h[4:], 2)
	binary.LittleEndian.PutUint16(h[6:], 4)
	binary.LittleEndian.PutUint32(h[16:], snapLen)
	binary.LittleEndian.PutUint32(h[20:], linkEther)
	if _, err := bw.Write(h[:]); err != nil {
		return nil, fmt.Errorf("writing pcap header: %w", err)
	}
	return &Writer{w: bw, conns: map[uint64]*connState{}}, nil
}

// Flush writes buffered records out.
func (w *Writer) Flush() error { return w.w.Flush() }

func (w *Writer) conn(id uint64) *connState {
	c := w.conns[id]
	if c == nil {
		c = &connState{}
		for d := range 2 {
			h := fnv.New32a()
			_ = binary.Write(h, binary.LittleEndian, [2]uint64{id, uint64(d)})
			c.isn[d] = h.Sum32()
		}
		w.conns[id] = c
	}
	return c
}

// Write writes one message: one segment, or several if it is longer than
// an IPv4 packet can carry (the payload bytes go with the first).
func (w *Writer) Write(m Message) error {
	if m.Dir > 1 {
		return fmt.Errorf("direction %d", m.Dir)
	}
	if m.Src.Addr().Is4() != m.Dst.Addr().Is4() {
		return errors.New("source and destination of different families")
	}
	c := w.conn(m.Conn)
	payload := m.Payload
	if len(payload) > int(m.Len) {
		payload = payload[:m.Len]
	}
	left := uint64(m.Len)
	off := m.Offset
	for first := true; first || left > 0; first = false {
		seg := min(left, maxSegment)
		var data []byte
		if first {
			data = payload[:min(len(payload), int(seg))]
		}
		full := uint64(len(data)) == seg
		ack := c.isn[1-m.Dir] + uint32(c.next[1-m.Dir])
		if err := w.segment(m, c.isn[m.Dir]+uint32(off), ack, data, int(seg), full); err != nil {
			return err
		}
		off += seg
		left -= seg
	}
	if end := m.Offset + uint64(m.Len); end > c.next[m.Dir] {
		c.next[m.Dir] = end
	}
	return nil
}

// segment writes one Ethernet frame carrying segLen payload bytes, of
// which data are captured. The TCP checksum is right when the whole
// payload is captured and zero otherwise.
func (w *Writer) segment(m Message, seq, ack uint32, data []byte, segLen int, full bool) error {
	v4 := m.Src.Addr().Is4()
	ipLen := ip6Len
	etherType := uint16(0x86dd)
	if v4 {
		ipLen, etherType = ip4Len, 0x0800
	}
	hdr := make([]byte, ethLen+ipLen+tcpLen)
	// Ethernet: locally administered addresses, one per side.
	hdr[0], hdr[5] = 0x02, 2-m.Dir
	hdr[6], hdr[11] = 0x02, 1+m.Dir
	binary.BigEndian.PutUint16(hdr[12:], etherType)
	ip := hdr[ethLen : ethLen+ipLen]
	src, dst := m.Src.Addr(), m.Dst.Addr()
	if v4 {
		w.ipID++
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(ip4Len+tcpLen+segLen))
		binary.BigEndian.PutUint16(ip[4:], w.ipID)
		binary.BigEndian.PutUint16(ip[6:], 0x4000) // don't fragment
		ip[8], ip[9] = 64, 6
		s4, d4 := src.As4(), dst.As4()
		copy(ip[12:16], s4[:])
		copy(ip[16:20], d4[:])
		binary.BigEndian.PutUint16(ip[10:], ^checksum(0, ip))
	} else {
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(tcpLen+segLen))
		ip[6], ip[7] = 6, 64
		s16, d16 := src.As16(), dst.As16()
		copy(ip[8:24], s16[:])
		copy(ip[24:40], d16[:])
	}
	tcp := hdr[ethLen+ipLen:]
	binary.BigEndian.PutUint16(tcp[0:], m.Src.Port())
	binary.BigEndian.PutUint16(tcp[2:], m.Dst.Port())
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[8:], ack)
	tcp[12] = tcpLen / 4 << 4
	tcp[13] = 0x18 // PSH, ACK
	binary.BigEndian.PutUint16(tcp[14:], 65535)
	if full {
		binary.BigEndian.PutUint16(tcp[16:], ^tcpChecksum(src, dst, tcp, data))
	}
	var rec [16]byte
	ts := m.Time.UnixNano()
	binary.LittleEndian.PutUint32(rec[0:], uint32(ts/1e9))
	binary.LittleEndian.PutUint32(rec[4:], uint32(ts%1e9))
	binary.LittleEndian.PutUint32(rec[8:], uint32(len(hdr)+len(data)))
	binary.LittleEndian.PutUint32(rec[12:], uint32(len(hdr)+segLen))
	for _, b := range [][]byte{rec[:], hdr, data} {
		if _, err := w.w.Write(b); err != nil {
			return fmt.Errorf("writing pcap record: %w", err)
		}
	}
	return nil
}

// checksum adds b to the one's-complement sum s.
func checksum(s uint32, b []byte) uint16 {
	for len(b) >= 2 {
		s += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}

func tcpChecksum(src, dst netip.Addr, tcp, data []byte) uint16 {
	var pseudo []byte
	l := len(tcp) + len(data)
	if src.Is4() {
		s, d := src.As4(), dst.As4()
		pseudo = append(append(pseudo, s[:]...), d[:]...)
		pseudo = append(pseudo, 0, 6, byte(l>>8), byte(l))
	} else {
		s, d := src.As16(), dst.As16()
		pseudo = append(append(pseudo, s[:]...), d[:]...)
		pseudo = append(pseudo, byte(l>>24), byte(l>>16), byte(l>>8), byte(l), 0, 0, 0, 6)
	}
	sum := uint32(checksum(0, pseudo))
	sum += uint32(checksum(0, tcp))
	// data may have an odd length only as the last part.
	sum += uint32(checksum(0, data))
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return uint16(sum)
}
