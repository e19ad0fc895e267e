package peer

import "testing"

// TestVerifierLocatesMismatch: a stream read with bytes delivered twice,
// skipped, or swapped is caught at its first wrong byte, and the bytes
// received there are placed in the expected stream (behind for a
// duplicate, ahead for a skip); garbage is placed nowhere.
func TestVerifierLocatesMismatch(t *testing.T) {
	const seed, size = 42, 3 << 20
	stream := make([]byte, size)
	newPayload(seed).fill(stream)
	garbage := make([]byte, 4096)
	for i := range garbage {
		garbage[i] = byte(i * 7)
	}
	cat := func(parts ...[]byte) []byte {
		var out []byte
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	const at = 2_000_000 // past the first ring's worth
	for _, tc := range []struct {
		name     string
		got      []byte
		mismatch int64
		from     int64
	}{
		{"intact", stream, -1, -1},
		// 23 segments of 1,448 bytes read twice.
		{"skb twice", cat(stream[:at], stream[at-33304:at], stream[at:]), at, at - 33304},
		{"skipped", cat(stream[:at], stream[at+5000:]), at, at + 5000},
		{"duplicate far behind", cat(stream[:at], stream[at-600000:at], stream[at:]), at, -1},
		{"garbage", cat(stream[:at], garbage, stream[at:]), at, -1},
		{"at the start", cat(stream[100:]), 0, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Reads of uneven sizes, as a socket returns them.
			for _, chunk := range []int{1000, 65536, 300000} {
				v := newVerifier(seed)
				for off := 0; off < len(tc.got); off += chunk {
					v.add(tc.got[off:min(off+chunk, len(tc.got))])
				}
				if v.mismatch != tc.mismatch || v.mismatchFrom != tc.from {
					t.Errorf("reads of %d: mismatch at %d from %d, want at %d from %d", chunk, v.mismatch, v.mismatchFrom, tc.mismatch, tc.from)
				}
			}
		})
	}
}
