package bench

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/socklane/socklane/internal/testbed"
)

// Programs people run, measured pod to pod like the tools (--tools names
// them; none runs unless asked): each one's own server and client.
const (
	Redis  = "redis"  // redis-server and redis-benchmark, one client: GET round trips
	Python = "python" // python3's http.server and urllib: a file fetched over a new connection each time
	Java   = "java"   // Java's blocking sockets (java.net.Socket): ping-pong
)

// Programs lists them.
func Programs() []string { return []string{Redis, Python, Java} }

// programCommands are the commands a program's measurement runs.
func programCommands(tool string) []string {
	switch tool {
	case Redis:
		return []string{"redis-server", "redis-benchmark"}
	case Python:
		return []string{"python3"}
	case Java:
		return []string{"java"}
	}
	return []string{tool}
}

// Base ports of the programs' servers, one per placement.
const (
	redisPort  = 16379
	pythonPort = 18000
	javaPort   = 18100
)

//go:embed programs/PingPong.java
var javaPingPong []byte

// pythonFetch fetches URL over a new connection each time for SECS seconds
// and prints the bytes per second it read.
const pythonFetch = `import sys, time, urllib.request
url, secs = sys.argv[1], float(sys.argv[2])
n, start = 0, time.monotonic()
while time.monotonic() - start < secs:
    with urllib.request.urlopen(url) as r:
        n += len(r.read())
print("bytes_per_sec=%f" % (n / (time.monotonic() - start)))
`

// programKinds are what a program measures.
func programKinds(tool string) []string {
	if tool == Python {
		return []string{Throughput}
	}
	return []string{Latency}
}

// startProgramServers starts each asked-for program's server per
// placement; files they serve or run live in dir.
func (r *runner) startProgramServers(dir string) error {
	for i, p := range r.o.Placements {
		for _, tool := range r.o.Tools {
			var err error
			switch tool {
			case Redis:
				err = r.startPinned(p.ServerCPU, tool, "redis-server", "--port", strconv.Itoa(redisPort+i), "--bind", "0.0.0.0",
					"--protected-mode", "no", "--save", "", "--appendonly", "no", "--daemonize", "no")
			case Python:
				root := filepath.Join(dir, "www")
				if err = os.MkdirAll(root, 0o755); err == nil {
					err = r.startPinned(p.ServerCPU, tool, "python3", "-m", "http.server", strconv.Itoa(pythonPort+i), "--bind", "0.0.0.0", "--directory", root)
				}
			case Java:
				src := filepath.Join(dir, "PingPong.java")
				if err = os.WriteFile(src, javaPingPong, 0o644); err == nil {
					err = r.startPinned(p.ServerCPU, tool, "java", src, "server", strconv.Itoa(javaPort+i))
				}
			}
			if err != nil {
				return err
			}
		}
	}
	if hasProgram(r.o.Tools) {
		// Java compiles its source at start: wait for every server.
		return r.waitPrograms()
	}
	return nil
}

func hasProgram(tools []string) bool {
	return slices.ContainsFunc(tools, func(t string) bool { return slices.Contains(Programs(), t) })
}

// waitPrograms waits until each program server accepts connections.
func (r *runner) waitPrograms() error {
	for i := range r.o.Placements {
		for _, tool := range r.o.Tools {
			port := 0
			switch tool {
			case Redis:
				port = redisPort + i
			case Python:
				port = pythonPort + i
			case Java:
				port = javaPort + i
			default:
				continue
			}
			if err := waitListening(r.server, port); err != nil {
				return fmt.Errorf("%s server: %w", tool, err)
			}
		}
	}
	return nil
}

// programFile is the file the python case fetches: size bytes.
func programFile(dir string, size int) (string, error) {
	name := fmt.Sprintf("f%d", size)
	path := filepath.Join(dir, "www", name)
	if _, err := os.Stat(path); err == nil {
		return name, nil
	}
	return name, os.WriteFile(path, []byte(strings.Repeat("x", size)), 0o644)
}

var (
	redisRPS = regexp.MustCompile(`"GET","([0-9.]+)"`)
	javaRTT  = regexp.MustCompile(`rtt_us=([0-9.]+)`)
	pyRate   = regexp.MustCompile(`bytes_per_sec=([0-9.]+)`)
)

// measureProgram runs one program client; latencies are round trips.
func (r *runner) measureProgram(c *Case, dir string) (Sample, error) {
	i := r.placementIndex(c)
	ip := r.server.IPv4.String()
	size := strconv.Itoa(c.Size)
	count := strconv.Itoa(r.o.Count)
	var args []string
	var re *regexp.Regexp
	switch c.Tool {
	case Redis:
		args = []string{"redis-benchmark", "-h", ip, "-p", strconv.Itoa(redisPort + i), "-c", "1", "-n", count, "-t", "get", "-d", size, "--csv"}
		re = redisRPS
	case Python:
		name, err := programFile(dir, c.Size)
		if err != nil {
			return Sample{}, err
		}
		secs := strconv.FormatFloat(r.o.ToolDuration.Seconds(), 'f', 3, 64)
		args = []string{"python3", "-c", pythonFetch, fmt.Sprintf("http://%s:%d/%s", ip, pythonPort+i, name), secs}
		re = pyRate
	case Java:
		args = []string{"java", filepath.Join(dir, "PingPong.java"), "client", ip, strconv.Itoa(javaPort + i), size, count}
		re = javaRTT
	default:
		return Sample{}, fmt.Errorf("no measurement for %s", c.Tool)
	}
	out, err := r.run(r.client, r.clientCPU(c), args...)
	if err != nil {
		return Sample{}, err
	}
	m := re.FindSubmatch(out)
	if m == nil {
		return Sample{}, fmt.Errorf("no result in %s output %q", c.Tool, out)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil || v <= 0 {
		return Sample{}, fmt.Errorf("%s result %q", c.Tool, m[1])
	}
	switch c.Tool {
	case Redis:
		return Sample{Mean: 1e6 / v, MsgRate: v}, nil
	case Python:
		return Sample{MBps: v / 1e6}, nil
	}
	return Sample{Mean: v}, nil
}

// programInstalled reports the first command of tool missing from PATH.
func programInstalled(tool string) error {
	for _, cmd := range programCommands(tool) {
		if _, err := exec.LookPath(cmd); err != nil {
			return fmt.Errorf("%s needs %s, which is not installed", tool, cmd)
		}
	}
	return nil
}

// waitListening waits up to a minute for a listener on port in pod's
// network namespace.
func waitListening(pod *testbed.Pod, port int) error {
	deadline := time.Now().Add(time.Minute)
	for {
		cmd, err := pod.Command("ss", "-Hltn", fmt.Sprintf("sport = :%d", port))
		if err != nil {
			return err
		}
		out, err := cmd.Output()
		if err == nil && len(strings.TrimSpace(string(out))) > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nothing listens on port %d after a minute", port)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
