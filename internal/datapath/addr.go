package datapath

import (
	"encoding/binary"
	"net/netip"
)

// The datapath keys every address as 16 bytes in network order, held in
// four words as the programs load them (IPv4 as IPv4-mapped IPv6): these
// two are the only conversions between them and Go's addresses, for every
// map and record (connections, events, captures, services).

// addrWords is a as the datapath holds it.
func addrWords(a netip.Addr) [4]uint32 {
	b := a.As16() // IPv4 becomes IPv4-mapped IPv6, as the datapath keys it
	var w [4]uint32
	for i := range w {
		// Network byte order in memory: the words are stored as read.
		w[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return w
}

// wordsAddr is the address the datapath holds as w (IPv4-mapped ones
// unmapped).
func wordsAddr(w [4]uint32) netip.Addr {
	var b [16]byte
	for i := range w {
		binary.NativeEndian.PutUint32(b[4*i:], w[i])
	}
	return netip.AddrFrom16(b).Unmap()
}
