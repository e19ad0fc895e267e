package peer

import (
	"encoding/binary"
	"testing"
)

func TestDNSAnswerA(t *testing.T) {
	q := dnsQueryA(0x1234, "who.svc.test")
	// An answer as a server writes it: the question, then one CNAME and
	// one A record with compressed names.
	ans := append([]byte{}, q...)
	ans[2], ans[3] = 0x81, 0x80
	binary.BigEndian.PutUint16(ans[6:], 2)
	ans = append(ans, 0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 60, 0, 2, 0xc0, 12)
	ans = append(ans, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 198, 18, 0, 9)
	cases := []struct {
		name string
		msg  []byte
		id   uint16
		want string
	}{
		{"cname then a", ans, 0x1234, "198.18.0.9"},
		{"other id", ans, 0x9999, ""},
		{"truncated", ans[:len(ans)-2], 0x1234, ""},
		{"question only", q, 0x1234, ""},
		{"short", q[:5], 0x1234, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := dnsAnswerA(tc.msg, tc.id)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("got %s, want an error", a)
				}
				return
			}
			if err != nil || a.String() != tc.want {
				t.Fatalf("got %s, %v; want %s", a, err, tc.want)
			}
		})
	}
}

func FuzzDNSAnswerA(f *testing.F) {
	f.Add(dnsQueryA(1, "a.b"), uint16(1))
	f.Fuzz(func(t *testing.T, m []byte, id uint16) {
		_, _ = dnsAnswerA(m, id) // must not panic
	})
}
