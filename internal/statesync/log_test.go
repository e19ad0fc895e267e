package statesync

import "testing"

func TestResendLog(t *testing.T) {
	l := newResendLog(4)
	if !l.holds(0) || len(l.read(0, 10)) != 0 {
		t.Fatal("an empty log holds everything after 0 and reads nothing")
	}
	for i := range 6 {
		if s := l.append(logged{table: uint32(i + 1)}); s != uint64(i+1) {
			t.Fatalf("append %d: seq %d", i, s)
		}
	}
	tests := []struct {
		after uint64
		holds bool
		want  []uint32
	}{
		{0, false, nil},
		{1, false, nil},
		{2, true, []uint32{3, 4, 5, 6}},
		{4, true, []uint32{5, 6}},
		{6, true, nil},
		{7, false, nil},
	}
	for _, tc := range tests {
		if got := l.holds(tc.after); got != tc.holds {
			t.Errorf("holds(%d) = %v, want %v", tc.after, got, tc.holds)
			continue
		}
		if !tc.holds {
			continue
		}
		got := l.read(tc.after, 10)
		if len(got) != len(tc.want) {
			t.Errorf("read(%d): %d changes, want %d", tc.after, len(got), len(tc.want))
			continue
		}
		for i := range got {
			if got[i].table != tc.want[i] {
				t.Errorf("read(%d)[%d] = %d, want %d", tc.after, i, got[i].table, tc.want[i])
			}
		}
	}
	if got := l.read(2, 2); len(got) != 2 || got[1].table != 4 {
		t.Errorf("read(2, max 2) = %v", got)
	}
}
