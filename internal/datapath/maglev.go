package datapath

import (
	"encoding/binary"
	"hash/fnv"
)

// maglevSize is the entries of a Maglev table (a prime).
const maglevSize = int(servicelbSlLbLayoutSL_MAGLEV_SIZE)

// maglevTable fills a Maglev lookup table (Eisenbud et al., NSDI 2016)
// over backends, each taking weights[i] entries per round: every backend
// walks its own permutation of the table, given by its address, so a
// backend's entries depend on the set, not on its index, and a change of
// backends moves about the entries of the backends that changed. It
// returns nil for no backends.
func maglevTable(backends []servicelbSlBackend, weights []uint16) *servicelbSlMaglev {
	if len(backends) == 0 {
		return nil
	}
	m := uint64(maglevSize)
	offset, skip, next := make([]uint64, len(backends)), make([]uint64, len(backends)), make([]uint64, len(backends))
	for i, b := range backends {
		var name [20]byte
		for w, word := range b.Ip {
			binary.LittleEndian.PutUint32(name[4*w:], word)
		}
		binary.LittleEndian.PutUint16(name[16:], b.Port)
		h := fnv.New64a()
		h.Write(name[:])
		h1 := h.Sum64()
		h.Write([]byte("skip"))
		h2 := h.Sum64()
		offset[i], skip[i] = h1%m, h2%(m-1)+1
	}
	var t servicelbSlMaglev
	filled := make([]bool, m)
	n := uint64(0)
	for n < m {
		for i := range backends {
			w := uint16(1)
			if i < len(weights) && weights[i] > 0 {
				w = weights[i]
			}
			for range w {
				c := (offset[i] + next[i]*skip[i]) % m
				for filled[c] {
					next[i]++
					c = (offset[i] + next[i]*skip[i]) % m
				}
				filled[c] = true
				t.Slot[c] = uint16(i)
				next[i]++
				if n++; n == m {
					return &t
				}
			}
		}
	}
	return &t
}

// maglevSig is a frontend's Maglev inputs in one number (a table is
// rewritten when it changes).
func maglevSig(backends []servicelbSlBackend, weights []uint16) uint64 {
	h := fnv.New64a()
	var buf [22]byte
	for i, b := range backends {
		for w, word := range b.Ip {
			binary.LittleEndian.PutUint32(buf[4*w:], word)
		}
		binary.LittleEndian.PutUint16(buf[16:], b.Port)
		wt := uint16(1)
		if i < len(weights) && weights[i] > 0 {
			wt = weights[i]
		}
		binary.LittleEndian.PutUint16(buf[18:], wt)
		h.Write(buf[:20])
	}
	return h.Sum64()
}
