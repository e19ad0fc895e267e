// Package e2e tests socklane end to end: real pods (network namespaces,
// bridge, cgroups), real programs on both ends, the socklane command, and
// assertions on the kernel's own counters.
package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/sockbugs"
	"github.com/socklane/socklane/internal/testbed"
	"github.com/socklane/socklane/internal/testutil"
)

var (
	integrityConns   = flag.Int("integrity.conns", 64, "concurrent connections in integrity tests")
	integrityBacklog = flag.Int("integrity.backlog", 1<<20, "--backlog-limit for TestBypassIntegrity (0: tcp_rmem max)")
	integrityWindow  = flag.Int("integrity.window", 4096, "--verdict-window for TestBypassIntegrity")
	integrityBytes   = flag.Int64("integrity.bytes", 512<<10, "average bytes per side per connection (64 conns x 2 x this = run size; 8MiB moves ~1GiB)")
)

// proc is a process started in a pod.
type proc struct {
	cmd *exec.Cmd
	out bytes.Buffer
	err bytes.Buffer
}

func start(t *testing.T, p *testbed.Pod, name string, args ...string) *proc {
	t.Helper()
	cmd, err := p.Command(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	pr := &proc{cmd: cmd}
	cmd.Stdout, cmd.Stderr = &pr.out, &pr.err
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return pr
}

func (p *proc) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		_ = p.cmd.Process.Kill()
		t.Fatalf("%s did not finish in %s (%v); stderr: %s", p.cmd.Args, d, <-done, p.err.String())
		return nil
	}
}

type summary struct {
	Conns    int    `json:"conns"`
	OK       int    `json:"ok"`
	Failed   int    `json:"failed"`
	Sent     uint64 `json:"bytes_sent"`
	Received uint64 `json:"bytes_received"`
}

// results parses the peer's JSON lines: failed rows and the summary.
func results(t *testing.T, out string) (summary, []string) {
	t.Helper()
	var sum summary
	var failed []string
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var m map[string]json.RawMessage
		if json.Unmarshal([]byte(line), &m) != nil {
			continue
		}
		if s, ok := m["summary"]; ok {
			_ = json.Unmarshal(s, &sum)
			continue
		}
		if string(m["ok"]) != "true" {
			failed = append(failed, line)
		}
	}
	return sum, failed
}

// integrity runs an integrity server in srv and a client in cli and checks
// every stream.
func integrity(t *testing.T, in *testutil.Instance, srv, cli *testbed.Pod, listen, target string, nconns int, extra ...string) summary {
	t.Helper()
	return integritySides(t, in, srv, cli, listen, target, nconns, extra, extra)
}

// integritySides is integrity with different flags for each side.
func integritySides(t *testing.T, in *testutil.Instance, srv, cli *testbed.Pod, listen, target string, nconns int, srvExtra, cliExtra []string) summary {
	t.Helper()
	bin := in.Bin
	conns := strconv.Itoa(nconns)
	bytesArg := strconv.FormatInt(*integrityBytes, 10)
	args := []string{"--conns", conns, "--bytes", bytesArg}
	// Where the kernel answers FIONREAD with 0 for redirected bytes (what
	// makes --bypass auto leave the bypass off there), streams bypassed
	// anyway are checked for everything else.
	if fionreadBypassed(t, in) {
		t.Log("this kernel's FIONREAD answers 0 for redirected bytes: peek streams do not check it")
		args = append(args, "--check-fionread=false")
	}
	server := start(t, srv, bin, slices.Concat([]string{"peer", "integrity-server", listen}, args, srvExtra)...)
	waitPort(t, srv, listen)
	client := start(t, cli, bin, slices.Concat([]string{"peer", "integrity-client", target}, args, cliExtra)...)
	cerr := client.wait(t, 5*time.Minute)
	serr := server.wait(t, time.Minute)
	csum, cfail := results(t, client.out.String())
	ssum, sfail := results(t, server.out.String())
	for _, f := range append(cfail, sfail...) {
		t.Errorf("stream failed: %s", f)
	}
	if cerr != nil || serr != nil {
		t.Fatalf("client: %v %s; server: %v %s", cerr, client.err.String(), serr, server.err.String())
	}
	if csum.Conns != nconns || ssum.Conns != nconns || csum.Failed+ssum.Failed != 0 {
		t.Fatalf("client %+v, server %+v", csum, ssum)
	}
	if csum.Sent != ssum.Received+uint64(resetLoss(csum, ssum)) && csum.Sent < ssum.Received {
		t.Fatalf("server received %d bytes, client sent %d", ssum.Received, csum.Sent)
	}
	return csum
}

// dpStatus is the part of `socklane status -o json` tests read about the
// kernel and the settings.
type dpStatus struct {
	Kernel   datapath.Features `json:"kernel"`
	Adapted  []string          `json:"adapted"`
	Decided  []string          `json:"decided"`
	Settings datapath.Settings `json:"settings"`
}

// readStatus reads the running datapath's kernel, adaptations and settings.
func readStatus(t *testing.T, in *testutil.Instance) dpStatus {
	t.Helper()
	out := in.MustRun("status", "-o", "json")
	var st dpStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("parsing status: %v\n%s", err, out)
	}
	return st
}

// fionreadBypassed: the datapath bypasses connections on a kernel whose
// FIONREAD answers 0 for redirected bytes.
func fionreadBypassed(t *testing.T, in *testutil.Instance) bool {
	t.Helper()
	st := readStatus(t, in)
	return st.Settings.Bypass.On() && st.Kernel.Has(sockbugs.FIONREAD)
}

// resetLoss is what RST-closed streams may legitimately cut off.
func resetLoss(c, s summary) uint64 {
	if c.Sent > s.Received {
		return c.Sent - s.Received
	}
	return 0
}

// waitPort waits until something listens on the pod's port.
func waitPort(t *testing.T, p *testbed.Pod, listen string) {
	t.Helper()
	waitSocket(t, p, "-Htln", listen)
}

// waitUDPPort waits for a UDP socket bound to listen's port.
func waitUDPPort(t *testing.T, p *testbed.Pod, listen string) {
	t.Helper()
	waitSocket(t, p, "-Huln", listen)
}

func waitSocket(t *testing.T, p *testbed.Pod, ssFlags, listen string) {
	t.Helper()
	port := listen[strings.LastIndex(listen, ":")+1:]
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		cmd, err := p.Command("ss", ssFlags, "sport = :"+port)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := cmd.Output()
		if strings.TrimSpace(string(out)) != "" {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("nothing listens on %s in pod %s", listen, p.Name)
}

func mustAtLeast(t *testing.T, d map[string]uint64, name string, min uint64) {
	t.Helper()
	if d[name] < min {
		t.Errorf("counter %s moved by %d, want >= %d (all deltas: %v)", name, d[name], min, nonzero(d))
	}
}

func mustEqual(t *testing.T, d map[string]uint64, name string, want uint64) {
	t.Helper()
	if d[name] != want {
		t.Errorf("counter %s moved by %d, want %d (all deltas: %v)", name, d[name], want, nonzero(d))
	}
}

func nonzero(d map[string]uint64) string {
	var b strings.Builder
	for k, v := range d {
		if v != 0 {
			fmt.Fprintf(&b, "%s=%d ", k, v)
		}
	}
	return b.String()
}

// lockedBuffer collects a process's output while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func waitForLog(t *testing.T, logs *lockedBuffer, f func() bool) {
	t.Helper()
	// A bound on failure, not a goal: an emulated kernel (the matrix)
	// takes tens of seconds to open the quota attacks' sockets.
	for i := 0; i < 1200; i++ {
		if f() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("condition never held in 60s; log:\n%s", logs.String())
}
