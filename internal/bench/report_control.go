package bench

import (
	"fmt"
	"io"
)

// controlMarkdown writes, for cases measured with --control, socklane's
// ratio to the bare redirect beside the bare redirect's ratio to itself:
// two runs of one path in the same repetitions, so the second column is
// the spread this machine puts between any two paths that cost the same.
func (r *Report) controlMarkdown(w io.Writer) {
	if !r.Control {
		return
	}
	fmt.Fprintln(w, "\n### The bare redirect against itself (--control)")
	fmt.Fprintln(w, "\nMedians of per-repetition ratios (range); latency by the mean round trip and by its p50, throughput by MB/s.")
	fmt.Fprintln(w, "\n| measurement | scenario | placement | size (B) | bypass / bare | bare again / bare | bypass / bare p50 | bare again / bare p50 |")
	fmt.Fprintln(w, "|---|---|---|---:|---:|---:|---:|---:|")
	for _, kind := range []string{Latency, Throughput} {
		for _, sc := range Scenarios() {
			for _, pl := range r.placements() {
				for _, c := range r.rows("", kind, sc, pl) {
					if !c.Control {
						continue
					}
					if kind == Throughput {
						fmt.Fprintf(w, "| %s | %s | %s | %d | %s | %s | - | - |\n", kind, sc, pl, c.Size,
							c.pairRatio(PathBypass, PathBare, mbps), c.pairRatio(PathBareAgain, PathBare, mbps))
						continue
					}
					fmt.Fprintf(w, "| %s | %s | %s | %d | %s | %s | %s | %s |\n", kind, sc, pl, c.Size,
						c.pairRatio(PathBypass, PathBare, mean), c.pairRatio(PathBareAgain, PathBare, mean),
						c.pairRatio(PathBypass, PathBare, p50), c.pairRatio(PathBareAgain, PathBare, p50))
				}
			}
		}
	}
}
