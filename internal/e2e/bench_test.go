package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/bench"
	"github.com/socklane/socklane/internal/testutil"
)

// TestBench runs `socklane bench` at a tiny size: every measurement and
// placement runs, the JSON parses, and the datapath's counters show that
// the bypass runs were redirected and the others were not. No speed is
// asserted.
func TestBench(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Binary(t)
	dir := t.TempDir()
	jsonPath, svgPath := filepath.Join(dir, "bench.json"), filepath.Join(dir, "bench.svg")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "--reps", "2", "--sizes", "1,4096", "--count", "200",
		"--duration", "50ms", "--echo-count", "200", "--connects", "20", "--json", jsonPath, "--svg", svgPath)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("socklane bench: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "| bypass / TCP |") {
		t.Errorf("no Markdown table in the output:\n%s", out)
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep bench.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("parsing the JSON report: %v", err)
	}
	// 2 sizes x (latency + throughput) + echo + connect, each on 2 placements.
	if want := (2*2 + 2) * 2; len(rep.Cases) != want {
		t.Fatalf("%d cases, want %d", len(rep.Cases), want)
	}
	for _, c := range rep.Cases {
		for _, path := range []string{bench.PathTCP, bench.PathBypass, bench.PathUnix} {
			ss := c.Samples[path]
			if len(ss) != 2 {
				t.Errorf("%s %d %s %s: %d samples, want 2", c.Kind, c.Size, c.Placement, path, len(ss))
			}
			for _, s := range ss {
				if (path == bench.PathBypass) != (s.Redirected > 0) {
					t.Errorf("%s %d %s %s: %d messages redirected", c.Kind, c.Size, c.Placement, path, s.Redirected)
				}
				if s.Mean == 0 && s.MBps == 0 {
					t.Errorf("%s %d %s %s: empty sample", c.Kind, c.Size, c.Placement, path)
				}
			}
		}
	}
	if len(rep.Programs) == 0 {
		t.Error("no BPF program statistics in the report")
	}
	svg, err := os.ReadFile(svgPath)
	if err != nil || !strings.HasPrefix(string(svg), "<svg") {
		t.Errorf("SVG chart missing or malformed: %v", err)
	}
}
