package peer

import (
	"slices"
	"testing"
)

func TestParsePorts(t *testing.T) {
	tests := []struct {
		in      string
		want    []uint16
		wantErr bool
	}{
		{"80", []uint16{80}, false},
		{"41000-41002", []uint16{41000, 41001, 41002}, false},
		{"65535-65535", []uint16{65535}, false},
		{"0", nil, true},
		{"5-4", nil, true},
		{"a-b", nil, true},
		{"", nil, true},
		{"70000", nil, true},
	}
	for _, tt := range tests {
		got, err := ParsePorts(tt.in)
		if (err != nil) != tt.wantErr || !slices.Equal(got, tt.want) {
			t.Errorf("ParsePorts(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func FuzzParsePorts(f *testing.F) {
	f.Add("41000-41049")
	f.Add("1")
	f.Fuzz(func(t *testing.T, s string) {
		ps, err := ParsePorts(s)
		if err != nil {
			return
		}
		if len(ps) == 0 || ps[0] == 0 || !slices.IsSorted(ps) {
			t.Fatalf("ParsePorts(%q) = %v", s, ps)
		}
	})
}
