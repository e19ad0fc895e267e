package statesync

import "github.com/socklane/socklane/internal/syncpb"

// resendLog holds the last changes this node originated, by sequence
// number, so that a peer that reconnects gets what it missed. It is a
// ring: once full, the oldest change goes, and a peer that had not
// applied it resyncs from a snapshot instead.
type resendLog struct {
	ring  []*syncpb.Entry
	first uint64 // sequence number of the oldest change held (0: none yet)
	last  uint64 // sequence number of the newest change
}

func newResendLog(size int) *resendLog {
	return &resendLog{ring: make([]*syncpb.Entry, size)}
}

// append records change seq (one more than the last).
func (l *resendLog) append(e *syncpb.Entry) uint64 {
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
func (l *resendLog) read(seq uint64, max int) []*syncpb.Entry {
	n := min(uint64(max), l.last-seq)
	out := make([]*syncpb.Entry, 0, n)
	for s := seq + 1; s <= seq+n; s++ {
		out = append(out, l.ring[s%uint64(len(l.ring))])
	}
	return out
}
