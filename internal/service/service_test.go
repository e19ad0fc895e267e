package service

import "testing"

// TestProtocolNumbers: the datapath's protocol numbers read back as the
// protocols they were written for.
func TestProtocolNumbers(t *testing.T) {
	for _, p := range []Protocol{TCP, UDP} {
		if got := ProtocolOf(p.Number()); got != p {
			t.Errorf("ProtocolOf(%s.Number() = %d) = %s", p, p.Number(), got)
		}
	}
	if TCP.Number() != 6 || UDP.Number() != 17 {
		t.Errorf("numbers %d and %d, want IPPROTO_TCP 6 and IPPROTO_UDP 17", TCP.Number(), UDP.Number())
	}
}
