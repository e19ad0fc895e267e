package e2e

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/testbed"
	"github.com/socklane/socklane/internal/testutil"
)

// defaultBypass: the instance loads with the default settings, as users
// run it, and reports whether that bypasses (--bypass auto: not on a
// kernel whose sockmap would break such programs, 6.1).
func defaultBypass(t *testing.T, in *testutil.Instance, pods ...*testbed.Pod) bool {
	t.Helper()
	in.Settings = nil
	in.Attach(pods...)
	st := readStatus(t, in)
	if !st.Settings.Bypass.On() {
		t.Logf("the default leaves the bypass off on this kernel: %q", st.Decided)
	}
	return st.Settings.Bypass.On()
}

// TestRedis runs an unmodified redis-server and redis-benchmark in two pods,
// with socklane's default settings. redis-benchmark's event-driven clients
// go socket to socket; so does redis-cli, which reads in blocking mode but
// handles no signal that can interrupt its reads (--blocking-sockets
// auto: per process), and its 900 kB value comes back intact. Where the
// default leaves the bypass off, all of it works over TCP.
func TestRedis(t *testing.T) {
	for _, c := range []string{"redis-server", "redis-benchmark", "redis-cli"} {
		testutil.RequireCommand(t, c)
	}
	b := testutil.Bed(t)
	in := testutil.NewInstance(t)
	srv, cli := testutil.Pod(t, b, "redis"), testutil.Pod(t, b, "bench")
	bypass := defaultBypass(t, in, srv, cli)
	dir := t.TempDir()
	start(t, srv, "redis-server", "--port", "6379", "--bind", "0.0.0.0", "--protected-mode", "no",
		"--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no")
	waitPort(t, srv, "0.0.0.0:6379")
	host := srv.IPv4.String()

	before := in.Counters()
	const requests, clients = 20000, 10
	out := run(t, cli, 2*time.Minute, "redis-benchmark", "-h", host, "-p", "6379",
		"-n", fmt.Sprint(requests), "-c", fmt.Sprint(clients), "-d", "1024", "-t", "set,get", "-q")
	if !strings.Contains(out, "SET:") || !strings.Contains(out, "GET:") {
		t.Fatalf("redis-benchmark output lacks results:\n%s", out)
	}
	t.Logf("redis-benchmark (bypass %v):\n%s", bypass, strings.TrimSpace(out))
	d := testutil.Delta(before, in.Counters())
	if !bypass {
		mustAtLeast(t, d, "fallback_bypass_off", clients)
		mustEqual(t, d, "redirect_bytes", 0)
	} else {
		redisBypassed(t, d, requests, clients)
	}

	before = in.Counters()
	value := strings.Repeat("socklane-", 100000) // 900 kB
	valueFile := filepath.Join(t.TempDir(), "value")
	if err := os.WriteFile(valueFile, []byte(value), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, cli, time.Minute, "sh", "-c", "redis-cli -h "+host+" -x set big < "+valueFile)
	got := run(t, cli, time.Minute, "redis-cli", "-h", host, "get", "big")
	if strings.TrimSpace(got) != value {
		t.Fatalf("redis-cli get returned %d bytes, want the %d stored", len(strings.TrimSpace(got)), len(value))
	}
	d = testutil.Delta(before, in.Counters())
	if !bypass {
		mustEqual(t, d, "redirect_msgs", 0)
		return
	}
	// redis-cli reads in blocking mode, and its process handles no
	// signal that can interrupt a read: both its connections bypassed.
	mustAtLeast(t, d, "conns_bypassed", 2)
	mustCarry(t, d, 2*uint64(len(value)))
	mustEqual(t, d, "fallback_blocking", 0)
}

// redisBypassed checks the counters of a benchmark run through the bypass.
func redisBypassed(t *testing.T, d map[string]uint64, requests, clients uint64) {
	t.Helper()
	mustAtLeast(t, d, "conns_bypassed", 2*clients)
	// Every request and every reply, in both tests, redirected: the 1 KiB
	// values both ways, and the small requests and replies under verdict
	// windows (one sl_msg run for several sends).
	mustAtLeast(t, d, "redirect_bytes", 2*requests*1024)
	mustAtLeast(t, d, "redirect_windows", 1)
	if d["pass_bytes"] > 1024 {
		t.Errorf("%d bytes of the benchmark went through TCP", d["pass_bytes"])
	}
}

// TestNginx serves a random file from nginx to curl across two pods, with
// and without sendfile, with socklane's default settings, and compares
// checksums (nginx sizes its reads by FIONREAD: where the kernel answers 0
// for redirected bytes the default leaves the bypass off).
func TestNginx(t *testing.T) {
	testutil.RequireCommand(t, "nginx")
	testutil.RequireCommand(t, "curl")
	for _, sendfile := range []string{"on", "off"} {
		t.Run("sendfile "+sendfile, func(t *testing.T) {
			b := testutil.Bed(t)
			in := testutil.NewInstance(t)
			srv, cli := testutil.Pod(t, b, "nginx"), testutil.Pod(t, b, "curl")
			bypass := defaultBypass(t, in, srv, cli)
			dir := t.TempDir()
			if err := os.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			blob := make([]byte, 32<<20)
			if _, err := rand.Read(blob); err != nil {
				t.Fatal(err)
			}
			want := sha256.Sum256(blob)
			if err := os.WriteFile(filepath.Join(dir, "blob"), blob, 0o644); err != nil {
				t.Fatal(err)
			}
			conf := fmt.Sprintf(`daemon off;
master_process off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log stderr warn;
events { worker_connections 64; }
http {
	access_log off;
	sendfile %[2]s;
	client_body_temp_path %[1]s/body;
	proxy_temp_path %[1]s/proxy;
	fastcgi_temp_path %[1]s/fastcgi;
	uwsgi_temp_path %[1]s/uwsgi;
	scgi_temp_path %[1]s/scgi;
	server {
		listen 8080;
		listen [::]:8080;
		root %[1]s;
	}
}
`, dir, sendfile)
			confPath := filepath.Join(dir, "nginx.conf")
			if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
				t.Fatal(err)
			}
			start(t, srv, "nginx", "-c", confPath, "-p", dir)
			waitPort(t, srv, "0.0.0.0:8080")
			before := in.Counters()
			for _, addr := range []netip.Addr{srv.IPv4, srv.IPv6} {
				url := "http://" + netip.AddrPortFrom(addr, 8080).String() + "/blob"
				out := run(t, cli, 2*time.Minute, "sh", "-c", "curl -sS --fail "+url+" | sha256sum")
				got := strings.Fields(out)
				if len(got) == 0 || got[0] != hex.EncodeToString(want[:]) {
					t.Fatalf("%s: sha256 %q, want %x", url, out, want)
				}
			}
			d := testutil.Delta(before, in.Counters())
			if !bypass {
				mustEqual(t, d, "fallback_bypass_off", 2)
				mustEqual(t, d, "redirect_bytes", 0)
				return
			}
			mustAtLeast(t, d, "conns_bypassed", 2)
			// All of it socket to socket, or passed to TCP by the
			// valve while curl (piped to sha256sum) caught up, unless
			// curl fell behind nginx by more than the backlog limit
			// without the valve and its direction moved to TCP, as it
			// does on a slow (emulated) CPU; the checksums held either
			// way.
			if d["fallback_backlog"] == 0 {
				mustCarry(t, d, 2*uint64(len(blob)))
			} else {
				mustAtLeast(t, d, "redirect_bytes", 1)
			}
		})
	}
}
