package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/socklane/socklane/internal/peer"
)

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

// wwwDir is where the HTTP servers' files live: readable by nginx's
// worker, which runs as nobody.
func (r *runner) wwwDir() (string, error) {
	root := filepath.Join(r.dir, "www")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", err
	}
	// Others may pass through the bench's own directory, not list it.
	return root, os.Chmod(r.dir, 0o711)
}

// programFile is the file the HTTP cases fetch: size bytes.
func (r *runner) programFile(size int) (string, error) {
	root, err := r.wwwDir()
	if err != nil {
		return "", err
	}
	name := fmt.Sprintf("f%d", size)
	path := filepath.Join(root, name)
	if _, err := os.Stat(path); err == nil {
		return name, nil
	}
	return name, os.WriteFile(path, []byte(strings.Repeat("x", size)), 0o644)
}

func startPython(r *runner, cpu, port int) error {
	root, err := r.wwwDir()
	if err != nil {
		return err
	}
	return r.startPinned(cpu, Python, "python3", "-m", "http.server", strconv.Itoa(port), "--bind", "0.0.0.0", "--directory", root)
}

func measurePython(r *runner, c *Case, ip string, port int) (Sample, error) {
	name, err := r.programFile(c.Size)
	if err != nil {
		return Sample{}, err
	}
	secs := strconv.FormatFloat(r.o.ToolDuration.Seconds(), 'f', 3, 64)
	rate, err := r.runParsed(c, pyRate, "python3", "-c", pythonFetch, fmt.Sprintf("http://%s:%d/%s", ip, port, name), secs)
	return Sample{MBps: rate / 1e6}, err
}

// nginxConf is a server as Debian configures one (sendfile on) with one
// worker, no access log, and keep-alive long enough for a whole run.
const nginxConf = `worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 256; }
http {
    access_log off;
    sendfile on;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    server {
        listen %[2]d;
        root %[3]s;
    }
}
`

func startNginx(r *runner, cpu, port int) error {
	root, err := r.wwwDir()
	if err != nil {
		return err
	}
	prefix := filepath.Join(r.dir, fmt.Sprintf("nginx-%d", port))
	if err := os.MkdirAll(prefix, 0o755); err != nil {
		return err
	}
	conf := filepath.Join(prefix, "nginx.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, nginxConf, prefix, port, root), 0o644); err != nil {
		return err
	}
	return r.startPinned(cpu, Nginx, "nginx", "-p", prefix+"/", "-e", "stderr", "-c", conf, "-g", "daemon off;")
}

// measureNginx has curl fetch the file count times over one connection
// (a URL range: curl keeps the connection alive between them) and
// times each transfer, the first (it connects) left out.
func measureNginx(r *runner, c *Case, ip string, port int) (Sample, error) {
	name, err := r.programFile(c.Size)
	if err != nil {
		return Sample{}, err
	}
	url := fmt.Sprintf("http://%s:%d/%s?n=[0-%d]", ip, port, name, r.o.Count)
	out, err := r.run(r.client, r.clientCPU(c), "curl", "--silent", "--show-error", "--fail", "--output", "/dev/null",
		"--write-out", `%{time_total} %{num_connects} %{size_download}\n`, url)
	if err != nil {
		return Sample{}, err
	}
	return parseCurl(out, c.Size)
}

// parseCurl reads curl's line a transfer (seconds, connections it
// opened, bytes), leaving out the first: later ones must have reused the
// connection and brought size bytes.
func parseCurl(out []byte, size int) (Sample, error) {
	var rtts []time.Duration
	sc := bufio.NewScanner(bytes.NewReader(out))
	for i := 0; sc.Scan(); i++ {
		var secs float64
		var conns, n int
		if _, err := fmt.Sscanf(sc.Text(), "%g %d %d", &secs, &conns, &n); err != nil {
			return Sample{}, fmt.Errorf("curl transfer %d: %q: %w", i, sc.Text(), err)
		}
		if n != size {
			return Sample{}, fmt.Errorf("curl transfer %d brought %d bytes, want %d", i, n, size)
		}
		if i == 0 {
			continue
		}
		if conns != 0 {
			return Sample{}, fmt.Errorf("curl transfer %d opened a connection: nginx did not keep the last one alive", i)
		}
		rtts = append(rtts, time.Duration(secs*1e9))
	}
	if len(rtts) == 0 {
		return Sample{}, fmt.Errorf("no curl transfers in %q", out)
	}
	l := peer.Summarize(size, rtts)
	s := Sample{MsgRate: 1e6 / l.Mean}
	s.setLatency(l)
	return s, nil
}
