package pcap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"
)

// Packet is one TCP segment read back from a pcap file.
type Packet struct {
	Time     time.Time
	Src, Dst netip.AddrPort
	Seq, Ack uint32
	Flags    uint8
	Payload  []byte // the captured payload bytes
	Len      int    // the segment's payload length on the wire
	// ChecksumOK: the TCP checksum verifies (only meaningful when the
	// whole payload was captured; false when it is zero).
	ChecksumOK bool
}

// Read parses a pcap file of Ethernet frames carrying IPv4 or IPv6 TCP
// segments; other frames are skipped.
func Read(r io.Reader) ([]Packet, error) {
	var h [24]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, fmt.Errorf("reading pcap header: %w", err)
	}
	var nanos bool
	switch binary.LittleEndian.Uint32(h[0:]) {
	case magicNanos:
		nanos = true
	case magicMicros:
	default:
		return nil, errors.New("not a little-endian pcap file")
	}
	if lt := binary.LittleEndian.Uint32(h[20:]); lt != linkEther {
		return nil, fmt.Errorf("link type %d, want Ethernet", lt)
	}
	var out []Packet
	for {
		var rec [16]byte
		if _, err := io.ReadFull(r, rec[:]); err == io.EOF {
			return out, nil
		} else if err != nil {
			return out, fmt.Errorf("reading record header: %w", err)
		}
		incl := binary.LittleEndian.Uint32(rec[8:])
		orig := binary.LittleEndian.Uint32(rec[12:])
		if incl > snapLen || incl > orig {
			return out, fmt.Errorf("record of %d bytes captured of %d", incl, orig)
		}
		frame := make([]byte, incl)
		if _, err := io.ReadFull(r, frame); err != nil {
			return out, fmt.Errorf("reading record: %w", err)
		}
		sub := int64(binary.LittleEndian.Uint32(rec[4:]))
		if !nanos {
			sub *= 1000
		}
		p, ok := parseFrame(frame, int(orig))
		if !ok {
			continue
		}
		p.Time = time.Unix(int64(binary.LittleEndian.Uint32(rec[0:])), sub)
		out = append(out, p)
	}
}

func parseFrame(f []byte, orig int) (Packet, bool) {
	var p Packet
	if len(f) < ethLen {
		return p, false
	}
	var src, dst netip.Addr
	var ipl int
	switch binary.BigEndian.Uint16(f[12:]) {
	case 0x0800:
		ip := f[ethLen:]
		if len(ip) < ip4Len || ip[0]>>4 != 4 || ip[9] != 6 {
			return p, false
		}
		ipl = int(ip[0]&0xf) * 4
		if ipl < ip4Len || len(ip) < ipl {
			return p, false
		}
		src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	case 0x86dd:
		ip := f[ethLen:]
		if len(ip) < ip6Len || ip[0]>>4 != 6 || ip[6] != 6 {
			return p, false
		}
		ipl = ip6Len
		src, dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
	default:
		return p, false
	}
	tcp := f[ethLen+ipl:]
	if len(tcp) < tcpLen {
		return p, false
	}
	off := int(tcp[12]>>4) * 4
	if off < tcpLen || len(tcp) < off {
		return p, false
	}
	p.Src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(tcp[0:]))
	p.Dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(tcp[2:]))
	p.Seq = binary.BigEndian.Uint32(tcp[4:])
	p.Ack = binary.BigEndian.Uint32(tcp[8:])
	p.Flags = tcp[13]
	p.Payload = tcp[off:]
	p.Len = orig - ethLen - ipl - off
	if p.Len == len(p.Payload) && binary.BigEndian.Uint16(tcp[16:]) != 0 {
		p.ChecksumOK = tcpChecksum(src, dst, tcp[:off], p.Payload) == 0xffff
	}
	return p, true
}
