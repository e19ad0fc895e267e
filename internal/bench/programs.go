package bench

import (
	"bytes"
	_ "embed"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/socklane/socklane/internal/peer"
	"github.com/socklane/socklane/internal/testbed"
)

// Programs people run, measured pod to pod like the tools (--tools names
// them; none runs unless asked): each one's own server and client.
const (
	Redis    = "redis"     // redis-server and redis-benchmark, one client: GET round trips
	RedisCLI = "redis-cli" // redis-server and redis-cli (blocking reads): GET round trips
	Python   = "python"    // python3's http.server and urllib: a file fetched over a new connection each time
	Java     = "java"      // Java's blocking sockets (java.net.Socket): ping-pong
	Nginx    = "nginx"     // nginx (a master and one worker, sendfile) and curl: GETs over one kept-alive connection
	GoHTTP   = "go-http"   // Go's net/http server and client: GETs over one kept-alive connection
	Postgres = "postgres"  // postgres and pgbench -S: one client's select-only transactions
)

// program is how bench runs one of them: the commands it needs, what it
// measures, its server (one per placement, on port+placement index) and
// its client.
type program struct {
	name     string
	commands []string // looked up with lookProgram
	kind     string   // Latency (round trips) or Throughput
	unsized  bool     // its messages are its own (one case, size 0), not --tool-sizes
	port     int
	start    func(r *runner, cpu, port int) error
	measure  func(r *runner, c *Case, ip string, port int) (Sample, error)
}

// programs are the programs bench knows, in the order of Programs.
func programs() []program {
	return []program{
		{name: Redis, commands: []string{"redis-server", "redis-benchmark"}, kind: Latency, port: 16379, start: startRedis, measure: measureRedis},
		{name: RedisCLI, commands: []string{"redis-server", "redis-cli"}, kind: Latency, port: 16479, start: startRedis, measure: measureRedisCLI},
		{name: Python, commands: []string{"python3"}, kind: Throughput, port: 18000, start: startPython, measure: measurePython},
		{name: Java, commands: []string{"java"}, kind: Latency, port: 18100, start: startJava, measure: measureJava},
		{name: Nginx, commands: []string{"nginx", "curl"}, kind: Latency, port: 18200, start: startNginx, measure: measureNginx},
		{name: GoHTTP, kind: Latency, port: 18300, start: startGoHTTP, measure: measureGoHTTP},
		{name: Postgres, commands: []string{"postgres", "initdb", "pgbench", "setpriv"}, kind: Latency, unsized: true, port: 15432, start: startPostgres, measure: measurePostgres},
	}
}

// Programs lists them.
func Programs() []string {
	var names []string
	for _, p := range programs() {
		names = append(names, p.name)
	}
	return names
}

func programNamed(name string) (program, bool) {
	i := slices.IndexFunc(programs(), func(p program) bool { return p.name == name })
	if i < 0 {
		return program{}, false
	}
	return programs()[i], true
}

// lookProgram finds a program's command on PATH, or postgres' own under
// /usr/lib/postgresql (Debian keeps them off PATH), newest version first.
func lookProgram(cmd string) (string, error) {
	if path, err := exec.LookPath(cmd); err == nil {
		return path, nil
	}
	found, _ := filepath.Glob(filepath.Join("/usr/lib/postgresql", "*", "bin", cmd))
	slices.SortFunc(found, func(a, b string) int { return pgVersion(b) - pgVersion(a) })
	if len(found) > 0 {
		return found[0], nil
	}
	return "", fmt.Errorf("%s not found", cmd)
}

// pgVersion is the major version in /usr/lib/postgresql/N/bin/x.
func pgVersion(path string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(path))))
	return v
}

// programInstalled reports the first command of tool missing.
func programInstalled(tool string) error {
	p, _ := programNamed(tool)
	for _, cmd := range p.commands {
		if _, err := lookProgram(cmd); err != nil {
			return fmt.Errorf("%s needs %s, which is not installed", tool, cmd)
		}
	}
	return nil
}

// startProgramServers starts each asked-for program's server per
// placement and waits until each accepts connections (Java compiles its
// source first, postgres creates its database).
func (r *runner) startProgramServers() error {
	for i, pl := range r.o.Placements {
		for _, tool := range r.o.Tools {
			if p, ok := programNamed(tool); ok {
				if err := p.start(r, pl.ServerCPU, p.port+i); err != nil {
					return fmt.Errorf("starting the %s server: %w", tool, err)
				}
			}
		}
	}
	for i := range r.o.Placements {
		for _, tool := range r.o.Tools {
			if p, ok := programNamed(tool); ok {
				if err := waitListening(r.server, p.port+i); err != nil {
					return fmt.Errorf("%s server: %w", tool, err)
				}
			}
		}
	}
	return nil
}

// measureProgram runs one program client; latencies are round trips.
func (r *runner) measureProgram(c *Case) (Sample, error) {
	p, ok := programNamed(c.Tool)
	if !ok {
		return Sample{}, fmt.Errorf("no measurement for %s", c.Tool)
	}
	return p.measure(r, c, r.server.IPv4.String(), p.port+r.placementIndex(c))
}

// runParsed runs a client command and reads the one number re finds in
// its output.
func (r *runner) runParsed(c *Case, re *regexp.Regexp, args ...string) (float64, error) {
	out, err := r.run(r.client, r.clientCPU(c), args...)
	if err != nil {
		return 0, err
	}
	return parseNumber(out, re, c.Tool)
}

// parseNumber reads the number re's first group finds in a tool's
// output, which must be positive.
func parseNumber(out []byte, re *regexp.Regexp, tool string) (float64, error) {
	m := re.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no result in %s output %q", tool, out)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("%s result %q", tool, m[1])
	}
	return v, nil
}

var (
	redisRPS = regexp.MustCompile(`"GET","([0-9.]+)"`)
	javaRTT  = regexp.MustCompile(`rtt_us=([0-9.]+)`)
	pyRate   = regexp.MustCompile(`bytes_per_sec=([0-9.]+)`)
	pgLat    = regexp.MustCompile(`latency average = ([0-9.]+) ms`)
	pgTPS    = regexp.MustCompile(`tps = ([0-9.]+)`)
)

func startRedis(r *runner, cpu, port int) error {
	return r.startPinned(cpu, Redis, "redis-server", "--port", strconv.Itoa(port), "--bind", "0.0.0.0",
		"--protected-mode", "no", "--save", "", "--appendonly", "no", "--daemonize", "no")
}

func measureRedis(r *runner, c *Case, ip string, port int) (Sample, error) {
	rps, err := r.runParsed(c, redisRPS, "redis-benchmark", "-h", ip, "-p", strconv.Itoa(port), "-c", "1",
		"-n", strconv.Itoa(r.o.Count), "-t", "get", "-d", strconv.Itoa(c.Size), "--csv")
	return Sample{Mean: 1e6 / rps, MsgRate: rps}, err
}

// measureRedisCLI has redis-cli repeat a GET over its one connection:
// the round trip is what count repeats take beyond a tenth of them (the
// difference leaves out starting the client and connecting). Starting
// redis-cli takes tens of milliseconds and varies by several, as much as
// hundreds of round trips: each count runs three times, alternating, and
// the fastest of each is taken; where the difference is still not
// positive the counts grow fourfold, twice at most.
func measureRedisCLI(r *runner, c *Case, ip string, port int) (Sample, error) {
	args := []string{"redis-cli", "-h", ip, "-p", strconv.Itoa(port)}
	if _, err := r.run(r.client, r.clientCPU(c), append(args, "SET", "k", strings.Repeat("x", c.Size))...); err != nil {
		return Sample{}, err
	}
	timed := func(count int) (time.Duration, error) {
		start := time.Now()
		out, err := r.run(r.client, r.clientCPU(c), append(args, "-r", strconv.Itoa(count), "GET", "k")...)
		if err != nil {
			return 0, err
		}
		if got := bytes.Count(out, []byte("\n")); got != count {
			return 0, fmt.Errorf("redis-cli answered %d GETs of %d", got, count)
		}
		return time.Since(start), nil
	}
	const tries = 3
	n := max(r.o.Count, 1000)
	var few, all time.Duration
	for grow := 0; grow < 3; grow, n = grow+1, n*4 {
		few, all = time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
		for range tries {
			d, err := timed(n / 10)
			if err != nil {
				return Sample{}, err
			}
			few = min(few, d)
			if d, err = timed(n); err != nil {
				return Sample{}, err
			}
			all = min(all, d)
		}
		if all > few {
			rtt := float64((all - few).Nanoseconds()) / 1e3 / float64(n-n/10)
			return Sample{Mean: rtt, MsgRate: 1e6 / rtt}, nil
		}
	}
	return Sample{}, fmt.Errorf("redis-cli: %d GETs took %v at the fastest, %d took %v", n/4, all, n/40, few)
}

//go:embed programs/PingPong.java
var javaPingPong []byte

func startJava(r *runner, cpu, port int) error {
	src := filepath.Join(r.dir, "PingPong.java")
	if err := os.WriteFile(src, javaPingPong, 0o644); err != nil {
		return err
	}
	return r.startPinned(cpu, Java, "java", src, "server", strconv.Itoa(port))
}

func measureJava(r *runner, c *Case, ip string, port int) (Sample, error) {
	rtt, err := r.runParsed(c, javaRTT, "java", filepath.Join(r.dir, "PingPong.java"), "client", ip, strconv.Itoa(port),
		strconv.Itoa(c.Size), strconv.Itoa(r.o.Count))
	return Sample{Mean: rtt}, err
}

func startGoHTTP(r *runner, cpu, port int) error {
	return r.startPinned(cpu, GoHTTP, r.self, "peer", "http-server", fmt.Sprintf("0.0.0.0:%d", port))
}

func measureGoHTTP(r *runner, c *Case, ip string, port int) (Sample, error) {
	var l peer.Latency
	err := r.runJSON(r.client, c, &l, r.self, "peer", "http-gets", fmt.Sprintf("http://%s:%d", ip, port),
		"--size", strconv.Itoa(c.Size), "--count", strconv.Itoa(r.o.Count), "--warmup", strconv.Itoa(min(1000, r.o.Count/10+1)))
	s := Sample{MsgRate: 1e6 / l.Mean}
	s.setLatency(l)
	return s, err
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

// stopSignal asks a server to stop on its own (postgres and nginx end
// their children); stopServers kills what is left after a grace period.
const stopSignal = syscall.SIGINT
