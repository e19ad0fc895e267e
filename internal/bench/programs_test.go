package bench

import (
	"strings"
	"testing"
)

// TestParseCurl reads curl's --write-out lines: the first transfer (it
// connects) left out, every later one on the same connection with the
// whole file.
func TestParseCurl(t *testing.T) {
	for _, tc := range []struct {
		name    string
		out     string
		size    int
		mean    float64 // us
		wantErr string
	}{
		{name: "kept alive", out: "0.001000 1 64\n0.000030 0 64\n0.000050 0 64\n", size: 64, mean: 40},
		{name: "one transfer only", out: "0.001000 1 64\n", size: 64, wantErr: "no curl transfers"},
		{name: "reconnected", out: "0.001000 1 64\n0.000030 0 64\n0.000900 1 64\n", size: 64, wantErr: "did not keep the last one alive"},
		{name: "short body", out: "0.001000 1 64\n0.000030 0 12\n", size: 64, wantErr: "brought 12 bytes, want 64"},
		{name: "garbage", out: "curl: (7) Failed to connect\n", size: 64, wantErr: "curl transfer 0"},
		{name: "empty", out: "", size: 64, wantErr: "no curl transfers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := parseCurl([]byte(tc.out), tc.size)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Mean < tc.mean-0.01 || s.Mean > tc.mean+0.01 || s.MsgRate <= 0 {
				t.Errorf("mean %v us, rate %v; want %v us", s.Mean, s.MsgRate, tc.mean)
			}
		})
	}
}

// TestPrograms: every program bench lists can be found by name, and
// only postgres ignores --tool-sizes.
func TestPrograms(t *testing.T) {
	for _, name := range Programs() {
		p, ok := programNamed(name)
		if !ok || p.start == nil || p.measure == nil || p.port == 0 || (p.kind != Latency && p.kind != Throughput) {
			t.Errorf("program %s: %+v", name, p)
		}
		if p.unsized != (name == Postgres) {
			t.Errorf("program %s: unsized %v", name, p.unsized)
		}
	}
	if _, ok := programNamed("qperf"); ok {
		t.Error("qperf is a tool, not a program")
	}
	if v := pgVersion("/usr/lib/postgresql/15/bin/pgbench"); v != 15 {
		t.Errorf("pgVersion: %d, want 15", v)
	}
}
