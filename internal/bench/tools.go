package bench

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"time"
)

// External tools run pod to pod beside socklane's own peers.
const (
	Qperf    = "qperf"    // tcp_lat (half round trip), tcp_bw
	Sockperf = "sockperf" // ping-pong (half round trip), throughput
	Iperf3   = "iperf3"   // throughput
)

// Tools lists the external tools bench knows.
func Tools() []string { return []string{Qperf, Sockperf, Iperf3} }

// InstalledTools is the subset of Tools found on PATH.
func InstalledTools() []string {
	var out []string
	for _, t := range Tools() {
		if _, err := exec.LookPath(t); err == nil {
			out = append(out, t)
		}
	}
	return out
}

func checkTools(tools []string) error {
	for _, t := range tools {
		if slices.Contains(Programs(), t) {
			if err := programInstalled(t); err != nil {
				return fmt.Errorf("%w (apt-get install it), or leave %s out of --tools", err, t)
			}
			continue
		}
		if !slices.Contains(Tools(), t) {
			return fmt.Errorf("unknown tool %q: want some of %v", t, append(Tools(), Programs()...))
		}
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("tool %s is not installed (apt-get install %s), or leave it out of --tools", t, t)
		}
	}
	return nil
}

// sockperfMinSize is sockperf's smallest message (its header).
const sockperfMinSize = 14

// Base ports of the tools' servers, one per placement.
const (
	qperfPort    = 19765
	sockperfPort = 11111
	iperf3Port   = 5201
)

func (r *runner) toolCases() []*Case {
	var cs []*Case
	for _, tool := range r.o.Tools {
		kinds, sizes := []string{Latency, Throughput}, r.o.ToolSizes
		if tool == Iperf3 {
			kinds = []string{Throughput}
		}
		if p, ok := programNamed(tool); ok {
			kinds = []string{p.kind}
			if p.unsized {
				sizes = []int{0}
			}
		}
		for _, kind := range kinds {
			for _, size := range sizes {
				if tool == Sockperf && size < sockperfMinSize {
					continue
				}
				for _, p := range r.o.Placements {
					cs = append(cs, &Case{Kind: kind, Tool: tool, Size: size, Placement: p.Name, Scenario: PodToPod, Samples: map[string][]Sample{}})
				}
			}
		}
	}
	return cs
}

func (r *runner) startToolServers() error {
	for i, p := range r.o.Placements {
		for _, tool := range r.o.Tools {
			var err error
			switch tool {
			case Qperf:
				err = r.startPinned(p.ServerCPU, tool, "qperf", "--listen_port", strconv.Itoa(qperfPort+i))
			case Sockperf:
				err = r.startPinned(p.ServerCPU, tool, "sockperf", "server", "--tcp", "-i", "0.0.0.0", "-p", strconv.Itoa(sockperfPort+i))
			case Iperf3:
				err = r.startPinned(p.ServerCPU, tool, "iperf3", "--server", "--port", strconv.Itoa(iperf3Port+i))
			}
			if err != nil {
				return err
			}
		}
	}
	if len(r.o.Tools) > 0 {
		time.Sleep(500 * time.Millisecond) // servers listening
	}
	return r.startProgramServers()
}

func (r *runner) placementIndex(c *Case) int {
	for i, p := range r.o.Placements {
		if p.Name == c.Placement {
			return i
		}
	}
	return 0
}

var (
	qperfValue    = regexp.MustCompile(`(?m)^\s*(latency|bw)\s*=\s*([0-9.]+)\s*(\S+)`)
	sockperfAvg   = regexp.MustCompile(`avg-latency=([0-9.]+)`)
	sockperfP999  = regexp.MustCompile(`percentile 99\.900 =\s*([0-9.]+)`)
	sockperfMax   = regexp.MustCompile(`<MAX> observation =\s*([0-9.]+)`)
	sockperfBW    = regexp.MustCompile(`BandWidth is ([0-9.]+) MBps`)
	sockperfRate  = regexp.MustCompile(`Message Rate is ([0-9.]+)`)
	unitMicros    = map[string]float64{"ns": 1e-3, "us": 1, "ms": 1e3, "sec": 1e6, "s": 1e6}
	unitMegabytes = map[string]float64{"bytes/sec": 1e-6, "KB/sec": 1e-3, "MB/sec": 1, "GB/sec": 1e3}
)

// measureTool runs one external tool client; latencies are reported as
// round trips (qperf and sockperf print half of one).
func (r *runner) measureTool(c *Case) (Sample, error) {
	i := r.placementIndex(c)
	ip := r.server.IPv4.String()
	secs := strconv.Itoa(max(1, int(r.o.ToolDuration.Round(time.Second)/time.Second)))
	size := strconv.Itoa(c.Size)
	var args []string
	switch {
	case c.Tool == Qperf && c.Kind == Latency:
		args = []string{"qperf", "--listen_port", strconv.Itoa(qperfPort + i), "-t", secs, "-m", size, ip, "tcp_lat"}
	case c.Tool == Qperf:
		args = []string{"qperf", "--listen_port", strconv.Itoa(qperfPort + i), "-t", secs, "-m", size, ip, "tcp_bw"}
	case c.Tool == Sockperf && c.Kind == Latency:
		args = []string{"sockperf", "ping-pong", "--tcp", "-i", ip, "-p", strconv.Itoa(sockperfPort + i), "-m", size, "-t", secs}
	case c.Tool == Sockperf:
		args = []string{"sockperf", "throughput", "--tcp", "-i", ip, "-p", strconv.Itoa(sockperfPort + i), "-m", size, "-t", secs}
	case c.Tool == Iperf3:
		args = []string{"iperf3", "--client", ip, "--port", strconv.Itoa(iperf3Port + i), "-t", secs, "-l", size, "--json"}
	case slices.Contains(Programs(), c.Tool):
		return r.measureProgram(c)
	default:
		return Sample{}, fmt.Errorf("no %s measurement for %s", c.Kind, c.Tool)
	}
	out, err := r.run(r.client, r.clientCPU(c), args...)
	if err != nil {
		return Sample{}, err
	}
	switch c.Tool {
	case Qperf:
		return parseQperf(out)
	case Sockperf:
		return parseSockperf(out, c.Kind)
	}
	return parseIperf3(out)
}

func parseQperf(out []byte) (Sample, error) {
	m := qperfValue.FindSubmatch(out)
	if m == nil {
		return Sample{}, fmt.Errorf("no result in qperf output %q", out)
	}
	v, err := strconv.ParseFloat(string(m[2]), 64)
	if err != nil {
		return Sample{}, err
	}
	unit := string(m[3])
	if string(m[1]) == "latency" {
		f, ok := unitMicros[unit]
		if !ok {
			return Sample{}, fmt.Errorf("qperf latency unit %q", unit)
		}
		return Sample{Mean: 2 * v * f}, nil
	}
	f, ok := unitMegabytes[unit]
	if !ok {
		return Sample{}, fmt.Errorf("qperf bandwidth unit %q", unit)
	}
	return Sample{MBps: v * f}, nil
}

func parseSockperf(out []byte, kind string) (Sample, error) {
	num := func(re *regexp.Regexp) (float64, error) {
		m := re.FindSubmatch(out)
		if m == nil {
			return 0, fmt.Errorf("no %s in sockperf output %q", re, out)
		}
		return strconv.ParseFloat(string(m[1]), 64)
	}
	var s Sample
	var err error
	if kind == Latency {
		if s.Mean, err = num(sockperfAvg); err != nil {
			return s, err
		}
		if s.P999, err = num(sockperfP999); err != nil {
			return s, err
		}
		if s.Max, err = num(sockperfMax); err != nil {
			return s, err
		}
		s.Mean, s.P999, s.Max = 2*s.Mean, 2*s.P999, 2*s.Max
		return s, nil
	}
	if s.MBps, err = num(sockperfBW); err != nil {
		return s, err
	}
	s.MsgRate, err = num(sockperfRate)
	return s, err
}

func parseIperf3(out []byte) (Sample, error) {
	var res struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return Sample{}, fmt.Errorf("parsing iperf3 JSON: %w", err)
	}
	if res.Error != "" {
		return Sample{}, fmt.Errorf("iperf3: %s", res.Error)
	}
	return Sample{MBps: res.End.SumReceived.BitsPerSecond / 8 / 1e6}, nil
}
