package bench

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// Median of one field over a path's samples.
func (c *Case) Median(path string, f func(Sample) float64) float64 {
	var v []float64
	for _, s := range c.Samples[path] {
		v = append(v, f(s))
	}
	return median(v)
}

func mean(s Sample) float64 { return s.Mean }
func p50(s Sample) float64  { return s.P50 }
func p999(s Sample) float64 { return s.P999 }
func mbps(s Sample) float64 { return s.MBps }

func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", a/b)
}

// pairRatio is a/b over the interleaved repetitions (the samples at one
// index ran one after the other): their median and spread, "-" when
// either path has no sample.
func (c *Case) pairRatio(a, b string, f func(Sample) float64) string {
	as, bs := c.Samples[a], c.Samples[b]
	var v []float64
	for i := range min(len(as), len(bs)) {
		if d := f(bs[i]); d != 0 {
			v = append(v, f(as[i])/d)
		}
	}
	if len(v) == 0 {
		return "-"
	}
	if len(v) == 1 {
		return fmt.Sprintf("%.2f", v[0])
	}
	return fmt.Sprintf("%.2f (%.2f-%.2f)", median(v), slices.Min(v), slices.Max(v))
}

// Markdown writes the report's tables.
func (r *Report) Markdown(w io.Writer) {
	if r.Sync != nil {
		r.Sync.Markdown(w)
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "Kernel %s, %d CPUs; medians of %d interleaved repetitions of every path a table compares; socklane's own peers use %s socket I/O.\n", r.Kernel, r.CPUs, r.Reps, r.IO)
	if r.Congestion != "" {
		fmt.Fprintf(w, "TCP's congestion control: %s (the pods' namespaces inherit the host's; where the valve runs, bypassed sockets under BBR run cubic instead, which does not pace the valve's passes).\n", r.Congestion)
	}
	if r.BypassBrief {
		fmt.Fprintln(w, "Every connection joined the bypass, brief ones too (--bypass-brief).")
	}
	if r.DefaultSettings {
		fmt.Fprintln(w, "The datapath ran with the agent's default settings (--default-settings): \"bypass\" columns are socklane's default path, which a table's last column names.")
	}
	if r.BypassSmallStreams {
		fmt.Fprintln(w, "Fast one-way streams of small sends stayed in the bypass (--bypass-small-streams).")
	}
	if r.Settings.BacklogValve.On() {
		fmt.Fprintln(w, "Writers ahead of their readers were pushed back through TCP while the readers caught up (the valve, the default where the kernel charges redirected bytes to their reader; --slow-readers-tcp moves such a direction to TCP instead).")
	} else {
		fmt.Fprintln(w, "A direction whose reader fell behind left the bypass for good (the backlog rule: --slow-readers-tcp, or a kernel where the pushback through TCP cannot run).")
	}
	if r.BareStreamVerdict {
		fmt.Fprintln(w, "The bare redirect had a pass-through stream verdict on its map (--bare-stream-verdict), as the valve has: both read through the kernel's parser receive path.")
	}
	if !r.BPFStats {
		fmt.Fprintln(w, "BPF run-time statistics were off (--bpf-stats=false): no per-program cost is reported.")
	}
	for _, sc := range Scenarios() {
		if d, ok := r.Scenarios[sc]; ok && slices.ContainsFunc(r.Cases, func(c *Case) bool { return c.Scenario == sc }) {
			fmt.Fprintf(w, "Scenario %s: %s.\n", sc, d)
		}
	}
	for _, kind := range []string{Latency, Echo, Connect, Throughput} {
		for _, sc := range Scenarios() {
			for _, pl := range r.placements() {
				rows := r.rows("", kind, sc, pl)
				if len(rows) == 0 {
					continue
				}
				fmt.Fprintf(w, "\n### %s, %s, %s\n\n", title(kind), sc, pl)
				if kind == Throughput {
					fmt.Fprintln(w, "| size (B) | TCP MB/s | bypass MB/s | bare MB/s | AF_UNIX MB/s | bypass / TCP | bare / TCP | bypass / bare (range) | bypass / AF_UNIX |")
					fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
					for _, c := range rows {
						t, b, x, u := c.Median(PathTCP, mbps), c.Median(PathBypass, mbps), c.Median(PathBare, mbps), c.Median(PathUnix, mbps)
						fmt.Fprintf(w, "| %d | %.1f | %.1f | %.1f | %.1f | %s | %s | %s | %s |\n", c.Size, t, b, x, u, ratio(b, t), ratio(x, t),
							c.pairRatio(PathBypass, PathBare, mbps), ratio(b, u))
					}
					continue
				}
				// The p50 ratio beside the mean's: a few stalls of a
				// millisecond move a mean of 150 us by several percent.
				fmt.Fprintln(w, "| size (B) | TCP mean us | bypass mean us | bare mean us | AF_UNIX mean us | bypass / TCP | bare / TCP | bypass / bare (range) | bypass / AF_UNIX | bypass / TCP p50 | TCP p99.9 us | bypass p99.9 us |")
				fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
				for _, c := range rows {
					t, b, x, u := c.Median(PathTCP, mean), c.Median(PathBypass, mean), c.Median(PathBare, mean), c.Median(PathUnix, mean)
					fmt.Fprintf(w, "| %d | %.1f | %.1f | %.1f | %.1f | %s | %s | %s | %s | %s | %.1f | %.1f |\n", c.Size, t, b, x, u, ratio(b, t), ratio(x, t),
						c.pairRatio(PathBypass, PathBare, mean), ratio(b, u),
						ratio(c.Median(PathBypass, p50), c.Median(PathTCP, p50)), c.Median(PathTCP, p999), c.Median(PathBypass, p999))
				}
			}
		}
	}
	r.controlMarkdown(w)
	r.toolMarkdown(w)
	r.servicesMarkdown(w)
	r.policiesMarkdown(w)
	r.portsMarkdown(w)
	r.fallbackMarkdown(w)
	r.valveMarkdown(w)
	if len(r.Programs) > 0 {
		fmt.Fprintln(w, "\n### BPF program cost (kernel run-time statistics over the whole run)")
		fmt.Fprintln(w, "\n| program | runs | ns per run |")
		fmt.Fprintln(w, "|---|---:|---:|")
		for _, p := range r.Programs {
			fmt.Fprintf(w, "| %s | %d | %.0f |\n", p.Name, p.Runs, p.NsRun)
		}
	}
}

func programMs(s Sample) float64 { return s.ProgramMs }

// policiesMarkdown sets the cost of N network policies beside none.
func (r *Report) policiesMarkdown(w io.Writer) {
	for _, pl := range r.placements() {
		rows := r.rows("", Policies, PodToPod, pl)
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n### Network policy: N policies on the node against none, pod-to-pod, %s\n\n", pl)
		fmt.Fprintln(w, "Short connections (connect + 64 B request + close; every policy selects the server, the client's egress is isolated too: each connection is judged at connect and at the server's SYN) and a 16 KiB-write stream (judged at its SYN only); time from the N policies to their enforcement (compiled, written, published; the previous tables are emptied after that).")
		fmt.Fprintln(w, "\n| policies | no policy us | policies us | connect cost policies / none | no policy MB/s | policies MB/s | stream policies / none | compile + program to live ms |")
		fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|")
		for _, c := range rows {
			n, p := c.Median(PathNoPolicy, mean), c.Median(PathPolicies, mean)
			tn, tp := c.Median(PathNoPolicy, mbps), c.Median(PathPolicies, mbps)
			fmt.Fprintf(w, "| %d | %.1f | %.1f | %s | %.0f | %.0f | %s | %.1f |\n", c.Size, n, p, ratio(p, n), tn, tp, ratio(tp, tn), c.Median(PathPolicies, programMs))
		}
	}
}

// runsMarkdown writes a table of the cases row gives a row for (its
// cells after the case's name, size, scenario and placement), under
// heading and the columns after those four; nothing if none does.
func (r *Report) runsMarkdown(w io.Writer, heading, columns string, row func(c *Case) (string, bool)) {
	header := false
	for _, c := range r.Cases {
		cells, ok := row(c)
		if !ok {
			continue
		}
		if !header {
			fmt.Fprintf(w, "\n### %s\n", heading)
			fmt.Fprintf(w, "\n| measurement | size (B) | scenario | placement | %s |\n", columns)
			fmt.Fprintf(w, "|---|---:|---|---|%s\n", strings.Repeat("---:|", strings.Count(columns, "|")+1))
			header = true
		}
		name := title(c.Kind)
		if c.Tool != "" {
			name = c.Tool + " " + c.Kind
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s |\n", name, c.Size, c.Scenario, c.Placement, cells)
	}
}

// fallbackMarkdown lists the bypass runs in which a direction left the
// bypass: because its receiver fell behind (the backlog rule), or as a
// fast one-way stream of small sends (which TCP coalesces). The rest of
// those runs went through TCP, and their ratio says so.
func (r *Report) fallbackMarkdown(w io.Writer) {
	r.runsMarkdown(w, "Bypass runs that moved to TCP (receiver behind by more than the backlog limit, or a fast stream of small sends)",
		"runs | directions moved: backlog | small stream", func(c *Case) (string, bool) {
			runs, backlog, small := 0, uint64(0), uint64(0)
			for _, s := range c.Samples[PathBypass] {
				if s.BacklogFallbacks+s.StreamFallbacks > 0 {
					runs++
					backlog += s.BacklogFallbacks
					small += s.StreamFallbacks
				}
			}
			return fmt.Sprintf("%d of %d | %d | %d", runs, len(c.Samples[PathBypass]), backlog, small), runs > 0
		})
}

// valveMarkdown lists the bypass runs in which the valve pushed a writer
// back through TCP while its reader caught up: how often, and the share
// of the bytes TCP carried (the rest were redirected).
func (r *Report) valveMarkdown(w io.Writer) {
	r.runsMarkdown(w, "Bypass runs in which the valve pushed the writer back through TCP",
		"runs | valve opens | bytes through TCP", func(c *Case) (string, bool) {
			runs, opens, passed, redirected := 0, uint64(0), uint64(0), uint64(0)
			for _, s := range c.Samples[PathBypass] {
				if s.ValveOpens > 0 {
					runs++
				}
				opens += s.ValveOpens
				passed += s.ValveBytes
				redirected += s.RedirectedBytes
			}
			return fmt.Sprintf("%d of %d | %d | %.1f%%", runs, len(c.Samples[PathBypass]), opens,
				100*float64(passed)/float64(max(passed+redirected, 1))), runs > 0
		})
}

// servicesMarkdown compares socklane's load balancer with kube-proxy's
// iptables rules per number of services.
func (r *Report) servicesMarkdown(w io.Writer) {
	for _, pl := range r.placements() {
		rows := r.rows("", Services, PodToPod, pl)
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n### Services: kube-proxy iptables rules against socklane's connect-time load balancer, pod-to-pod, %s\n\n", pl)
		fmt.Fprintln(w, "Short connections (connect + 64 B request + close) to one service of N; programming time of all N.")
		fmt.Fprintln(w, "Direct: no service, the client connects to a backend's own address; iptables / direct is the highest rate ratio any connect-time load balancer could reach here.")
		fmt.Fprintln(w, "\n| services | iptables us | socklane us | direct us | connection rate socklane / iptables | ceiling: iptables / direct | iptables p99.9 us | socklane p99.9 us | iptables-restore ms | socklane apply ms |")
		fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		var based []*Case
		for _, c := range rows {
			s, d := c.Median(PathSockLB, mean), c.Median(PathDirect, mean)
			if c.NoBaseline {
				fmt.Fprintf(w, "| %d | not run | %.1f | %.1f | - | - | not run | %.1f | not run | %.1f |\n", c.Size, s, d,
					c.Median(PathSockLB, p999), c.Median(PathSockLB, programMs))
				continue
			}
			based = append(based, c)
			t := c.Median(PathIptables, mean)
			fmt.Fprintf(w, "| %d | %.1f | %.1f | %.1f | %s | %s | %.1f | %.1f | %.1f | %.1f |\n", c.Size, t, s, d, ratio(t, s), ratio(t, d),
				c.Median(PathIptables, p999), c.Median(PathSockLB, p999), c.Median(PathIptables, programMs), c.Median(PathSockLB, programMs))
		}
		if len(rows) > 1 {
			first, last := rows[0], rows[len(rows)-1]
			fmt.Fprintf(w, "\nCost at %d services against %d: socklane %s", last.Size, first.Size,
				ratio(last.Median(PathSockLB, mean), first.Median(PathSockLB, mean)))
			if len(based) > 1 {
				bf, bl := based[0], based[len(based)-1]
				fmt.Fprintf(w, "; iptables at %d against %d: %s", bl.Size, bf.Size,
					ratio(bl.Median(PathIptables, mean), bf.Median(PathIptables, mean)))
			}
			fmt.Fprintln(w, ".")
		}
	}
}

// toolMarkdown puts each external tool's figures beside socklane's own
// client's ratio at the same size and placement (pod to pod).
func (r *Report) toolMarkdown(w io.Writer) {
	for _, tool := range append(Tools(), Programs()...) {
		for _, kind := range []string{Latency, Throughput} {
			for _, pl := range r.placements() {
				rows := r.rows(tool, kind, PodToPod, pl)
				if len(rows) == 0 {
					continue
				}
				unit, f := "RTT us", mean
				if kind == Throughput {
					unit, f = "MB/s", mbps
				}
				fmt.Fprintf(w, "\n### %s %s, pod-to-pod, %s\n\n", tool, kind, pl)
				fmt.Fprintf(w, "| size (B) | TCP %s | bypass %s | bare %s | bypass / TCP | bare / TCP | bypass / bare (range) | socklane client bypass / TCP |", unit, unit, unit)
				if r.DefaultSettings {
					fmt.Fprint(w, " socklane's path |")
				}
				fmt.Fprintln(w)
				fmt.Fprint(w, "|---:|---:|---:|---:|---:|---:|---:|---:|")
				if r.DefaultSettings {
					fmt.Fprint(w, "---|")
				}
				fmt.Fprintln(w)
				for _, c := range rows {
					t, b, x := c.Median(PathTCP, f), c.Median(PathBypass, f), c.Median(PathBare, f)
					own := "-"
					for _, o := range r.rows("", kind, PodToPod, pl) {
						if o.Size == c.Size {
							own = ratio(o.Median(PathBypass, f), o.Median(PathTCP, f))
						}
					}
					fmt.Fprintf(w, "| %d | %.1f | %.1f | %.1f | %s | %s | %s | %s |", c.Size, t, b, x, ratio(b, t), ratio(x, t), c.pairRatio(PathBypass, PathBare, f), own)
					if r.DefaultSettings {
						fmt.Fprintf(w, " %s |", c.pathTaken())
					}
					fmt.Fprintln(w)
				}
			}
		}
	}
}

// rows are the cases of one table.
func (r *Report) rows(tool, kind, scenario, placement string) []*Case {
	var out []*Case
	for _, c := range r.Cases {
		if c.Tool == tool && c.Kind == kind && c.Scenario == scenario && c.Placement == placement {
			out = append(out, c)
		}
	}
	return out
}

func title(kind string) string {
	switch kind {
	case Latency:
		return "Round-trip latency (ping-pong)"
	case Echo:
		return "tcp-bypasser echo (1 KiB requests)"
	case Connect:
		return "Short connections (connect + 64 B request + close)"
	}
	return "One-way stream throughput"
}

func (r *Report) placements() []string {
	var out []string
	for _, c := range r.Cases {
		if !slices.Contains(out, c.Placement) {
			out = append(out, c.Placement)
		}
	}
	return out
}

// SVG draws bypass/TCP per size: latency (lower is better) and throughput
// (higher is better), one bar per placement, with the parity line.
func (r *Report) SVG(w io.Writer) error {
	type bar struct {
		label string
		v     float64
	}
	var groups [][]bar
	var names []string
	for _, kind := range []string{Latency, Throughput} {
		for _, pl := range r.placements() {
			var g []bar
			for _, c := range r.rows("", kind, PodToPod, pl) {
				f := mean
				if kind == Throughput {
					f = mbps
				}
				t, b := c.Median(PathTCP, f), c.Median(PathBypass, f)
				if t > 0 {
					g = append(g, bar{fmt.Sprint(c.Size), b / t})
				}
			}
			if len(g) > 0 {
				groups = append(groups, g)
				names = append(names, fmt.Sprintf("%s bypass/TCP, pod-to-pod, %s", kind, pl))
			}
		}
	}
	const rowH, left, barW, gap = 170, 60, 34, 8
	width := left + 20
	for _, g := range groups {
		width = max(width, left+len(g)*(barW+gap)+20)
	}
	height := len(groups)*rowH + 20
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	for i, g := range groups {
		top := 10 + i*rowH
		maxV := 2.0
		for _, x := range g {
			maxV = max(maxV, x.v)
		}
		scale := float64(rowH-50) / maxV
		base := top + rowH - 30
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="13">%s</text>`+"\n", left, top+12, names[i])
		one := base - int(scale)
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#c00" stroke-dasharray="4"/><text x="4" y="%d">1.0</text>`+"\n", left-5, width-10, one, one, one+4)
		for j, x := range g {
			h := int(x.v * scale)
			xp := left + j*(barW+gap)
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="#3572b0"/>`+"\n", xp, base-h, barW, h)
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%.2f</text>`+"\n", xp+barW/2, base-h-3, x.v)
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", xp+barW/2, base+14, x.label)
		}
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func bindUs(s Sample) float64 { return s.BindUs }

// portsMarkdown sets bind and connect under N port workload rules, as a
// bystander and as one of the workloads, beside none.
func (r *Report) portsMarkdown(w io.Writer) {
	for _, pl := range r.placements() {
		rows := r.rows("", Ports, Loopback, pl)
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n### Port virtualization: N workload rules against none, a program of the node's network namespace, %s\n\n", pl)
		fmt.Fprintln(w, "Bind: socket + bind(127.0.0.1:3101) + close. Connect: connect to 127.0.0.1:3100 + 64 B echoed + close. none: no rule, no hook. bystander: N workloads with those virtual ports, the hooks on the program's cgroup, the program in none of them (what every other program pays). workload: the program is one of the N (its bind draws a real port from its pool and gives it back; its connect reaches its own binding).")
		fmt.Fprintln(w, "\n| workloads | bind none us | bind bystander us | bystander / none | bind workload us | workload / none | connect none us | connect bystander us | bystander / none | connect workload us | workload / none | program ms |")
		fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		for _, c := range rows {
			bn, bb, bw := c.Median(PathNoPortRules, bindUs), c.Median(PathBystander, bindUs), c.Median(PathPortRules, bindUs)
			cn, cb, cw := c.Median(PathNoPortRules, mean), c.Median(PathBystander, mean), c.Median(PathPortRules, mean)
			fmt.Fprintf(w, "| %d | %.2f | %.2f | %s | %.2f | %s | %.1f | %.1f | %s | %.1f | %s | %.1f |\n", c.Size, bn, bb, ratio(bb, bn), bw, ratio(bw, bn),
				cn, cb, ratio(cb, cn), cw, ratio(cw, cn), c.Median(PathPortRules, programMs))
		}
	}
}

// pathTaken says which path a case's socklane samples took: bypass, or
// TCP and why (--default-settings), per sample where they differ.
func (c *Case) pathTaken() string {
	ss := c.Samples[PathBypass]
	kept := map[string]int{}
	for _, s := range ss {
		if s.KeptOnTCP != "" {
			kept[s.KeptOnTCP]++
		}
	}
	n := 0
	var parts []string
	for _, reason := range slices.Sorted(maps.Keys(kept)) {
		n += kept[reason]
		parts = append(parts, fmt.Sprintf("TCP (%s)", reason))
		if kept[reason] != len(ss) {
			parts[len(parts)-1] += fmt.Sprintf(" in %d of %d", kept[reason], len(ss))
		}
	}
	if n < len(ss) {
		b := "bypass"
		if n > 0 {
			b += fmt.Sprintf(" in %d of %d", len(ss)-n, len(ss))
		}
		parts = append([]string{b}, parts...)
	}
	return strings.Join(parts, ", ")
}
