package statesync

import "unsafe"

// logged is a change in the log, or an entry of a snapshot: the key and
// the version (entries are never changed once made), two pointers.
type logged struct {
	key   string
	en    *entry
	table uint32
}

// rec is the entry as sent; its key is the string's bytes, not to be
// written.
func (l logged) rec() rec {
	if l.en == nil {
		return rec{table: l.table}
	}
	return rec{
		table: l.table, key: unsafe.Slice(unsafe.StringData(l.key), len(l.key)), value: l.en.value,
		deleted: l.en.deleted, ver: l.en.ver, captured: l.en.captured,
	}
}

// resendLog holds the last changes this node originated, by sequence
// number, so that a peer that reconnects gets what it missed. It is a
// ring: once full, the oldest change goes, and a peer that had not
// applied it resyncs from a snapshot instead.
type resendLog struct {
	ring  []logged
	first uint64 // sequence number of the oldest change held (0: none yet)
	last  uint64 // sequence number of the newest change
}

func newResendLog(size int) *resendLog {
	return &resendLog{ring: make([]logged, size)}
}

// append records change seq (one more than the last).
func (l *resendLog) append(e logged) uint64 {
	l.last++
	l.ring[l.last%uint64(len(l.ring))] = e
	if l.first == 0 {
		l.first = l.last
	}
	if l.last-l.first >= uint64(len(l.ring)) {
		l.first = l.last - uint64(len(l.ring)) + 1
	}
	return l.last
}

// holds reports whether every change after seq is still held.
func (l *resendLog) holds(seq uint64) bool {
	return seq == l.last || (l.first != 0 && seq+1 >= l.first && seq <= l.last)
}

// read returns up to max changes after seq (holds(seq) must be true).
func (l *resendLog) read(seq uint64, max int) []rec {
	n := min(uint64(max), l.last-seq)
	out := make([]rec, 0, n)
	for s := seq + 1; s <= seq+n; s++ {
		out = append(out, l.ring[s%uint64(len(l.ring))].rec())
	}
	return out
}
