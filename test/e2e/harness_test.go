// Package e2e tests socklane end to end: real pods (network namespaces,
// bridge, cgroups), real programs on both ends, the socklane command, and
// assertions on the kernel's own counters.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/cri"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/peer"
	"github.com/socklane/socklane/internal/testbed"
	"github.com/socklane/socklane/internal/testutil"
)

var (
	integrityConns   = flag.Int("integrity.conns", 64, "concurrent connections in integrity tests")
	integrityBacklog = flag.Int("integrity.backlog", 1<<20, "--backlog-limit for TestBypassIntegrity (0: tcp_rmem max)")
	integrityWindow  = flag.Int("integrity.window", 4096, "--verdict-window for TestBypassIntegrity")
	integrityReaders = flag.String("integrity.slow-readers", "", "--slow-readers for TestBypassIntegrity (empty: the default)")
	integrityBytes   = flag.Int64("integrity.bytes", 512<<10, "average bytes per side per connection (64 conns x 2 x this = run size; 8MiB moves ~1GiB)")
	integritySlow    = flag.Int64("integrity.slow-bytes", 16<<20, "bytes each slow-receiver connection floods in integrity runs whose test does not set --slow-bytes")
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
	if !slices.Contains(cliExtra, "--slow-bytes") {
		args = append(args, "--slow-bytes", strconv.FormatInt(*integritySlow, 10))
	}
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
	Sockets  int               `json:"bypassed_sockets"` // in the socket maps
}

// readStatus reads the running datapath's kernel, adaptations, settings
// and socket count.
func readStatus(t *testing.T, in *testutil.Instance) dpStatus {
	t.Helper()
	out := in.MustRun("status", "-o", "json")
	var st dpStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("parsing status: %v\n%s", err, out)
	}
	return st
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

// mustCarry checks that bypassed connections carried at least min bytes:
// redirected, or passed to TCP by the open valve while their reader
// caught up (the connection stays bypassed; the valve is the default where
// the kernel runs it). With bytes through the valve, it also checks that the
// valve opened.
func mustCarry(t *testing.T, d map[string]uint64, min uint64) {
	t.Helper()
	if d["redirect_bytes"]+d["valve_bytes"] < min {
		t.Errorf("%d bytes redirected and %d passed by the valve, want >= %d in all (all deltas: %v)", d["redirect_bytes"], d["valve_bytes"], min, nonzero(d))
	}
	if d["valve_bytes"] > 0 && d["valve_opens"] == 0 {
		t.Errorf("%d bytes passed by a valve that never opened (all deltas: %v)", d["valve_bytes"], nonzero(d))
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

// run runs a command in a pod to completion and returns its stdout.
func run(t *testing.T, p *testbed.Pod, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	pr := start(t, p, name, args...)
	if err := pr.wait(t, timeout); err != nil {
		t.Fatalf("%s %s: %v\nstdout: %s\nstderr: %s", name, strings.Join(args, " "), err, pr.out.String(), pr.err.String())
	}
	return pr.out.String()
}

func waitFor(t *testing.T, f func() bool) {
	t.Helper()
	for i := 0; i < 200; i++ {
		if f() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("condition never held")
}

func criPods(t *testing.T, rt *testutil.Runtime) map[string]cri.Pod {
	t.Helper()
	pods, err := rt.Client.Pods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]cri.Pod{}
	for _, p := range pods {
		out[p.Key()] = p
	}
	return out
}

// managedPods reads `socklane pods -o json` of an instance.
func managedPods(t *testing.T, in *testutil.Instance, socket string) map[string]bool {
	t.Helper()
	var views []struct {
		Namespace, Name string
		Managed         bool `json:"managed"`
	}
	out := in.MustRun("pods", "-o", "json", "--cri-socket", socket)
	if err := json.Unmarshal([]byte(out), &views); err != nil {
		t.Fatalf("pods -o json: %v\n%s", err, out)
	}
	m := map[string]bool{}
	for _, v := range views {
		m[v.Namespace+"/"+v.Name] = v.Managed
	}
	return m
}

// startAgent runs `socklane agent` on the bed's pods with extra flags.
func startAgent(t *testing.T, lb *lbBed, logs *lockedBuffer, extra ...string) *proc {
	t.Helper()
	args := []string{"--name", lb.in.Name, "agent", "--cgroup", lb.client.Cgroup, "--metrics-address", ""}
	for _, p := range lb.back {
		args = append(args, "--cgroup", p.Cgroup)
	}
	cmd := exec.Command(lb.in.Bin, append(args, extra...)...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return &proc{cmd: cmd}
}

func ptr[T any](v T) *T { return &v }

func httpGet(url string) (int, string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// background runs socklane in the background and waits for it to print
// readyLine on stderr; it returns the process and its stdout.
func background(t *testing.T, in *testutil.Instance, readyLine string, args ...string) (*exec.Cmd, io.Reader, *lockedBuffer) {
	t.Helper()
	cmd := exec.Command(in.Bin, append([]string{"--name", in.Name}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	var errText lockedBuffer
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		signalled := false
		for sc.Scan() {
			fmt.Fprintln(&errText, sc.Text())
			if !signalled && strings.Contains(sc.Text(), readyLine) {
				close(ready)
				signalled = true
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(20 * time.Second):
		t.Fatalf("socklane %v did not become ready: %s", args, errText.String())
	}
	return cmd, stdout, &errText
}

// owners reads `status -o json`'s owners over quota and quotas.
func owners(t *testing.T, in *testutil.Instance) ([]datapath.Owner, datapath.Quotas) {
	t.Helper()
	var st struct {
		Quotas    datapath.Quotas  `json:"owner_quotas"`
		OverQuota []datapath.Owner `json:"owners_over_quota"`
	}
	if err := json.Unmarshal([]byte(in.MustRun("status", "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	return st.OverQuota, st.Quotas
}

// holder is a `peer hold` process: sockets held open through a VIP.
type holder struct {
	cmd     *exec.Cmd
	events  chan peer.HoldEvent
	backend map[int]string // socket index -> backend it reached
}

func startHold(t *testing.T, in *testutil.Instance, from *testbed.Pod, conns int, args ...string) *holder {
	t.Helper()
	cmd, err := from.Command(in.Bin, append([]string{"peer", "hold", "--conns", fmt.Sprint(conns), "--for", "60s"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &holder{cmd: cmd, events: make(chan peer.HoldEvent, 4*conns), backend: map[int]string{}}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	go func() {
		defer close(h.events)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var e peer.HoldEvent
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				h.events <- e
			}
		}
	}()
	deadline := time.After(60 * time.Second) // emulated kernels are slow
	for {
		select {
		case e, ok := <-h.events:
			if !ok {
				t.Fatalf("peer hold %v ended before all sockets were open: %s", args, stderr.String())
			}
			switch e.Event {
			case "open":
				h.backend[e.Index] = e.Backend
			case "ready":
				return h
			case "closed":
				t.Fatalf("socket %d closed before the test began: %s", e.Index, e.Error)
			}
		case <-deadline:
			t.Fatalf("peer hold %v: sockets not open after 60s: %s", args, stderr.String())
		}
	}
}

// on lists the sockets that reached backend.
func (h *holder) on(backend string) []int {
	var out []int
	for i, b := range h.backend {
		if b == backend {
			out = append(out, i)
		}
	}
	slices.Sort(out)
	return out
}

// closed collects close events until want sockets have closed and then
// for linger more (to catch sockets that should have stayed open).
func (h *holder) closed(t *testing.T, want int, linger time.Duration) map[int]string {
	t.Helper()
	got := map[int]string{}
	timeout := time.After(10 * time.Second)
	var settle <-chan time.Time
	if want == 0 {
		settle = time.After(linger)
	}
	for {
		select {
		case e, ok := <-h.events:
			if !ok {
				return got
			}
			if e.Event == "closed" {
				got[e.Index] = e.Error
				if len(got) == want {
					settle = time.After(linger)
				}
			}
		case <-settle:
			return got
		case <-timeout:
			return got
		}
	}
}

// lbBed is a client pod, a host-network client and two backend pods, each
// backend answering its own name over TCP and UDP on port 8080.
type lbBed struct {
	bed    *testbed.Bed // more pods join it, on its bridge
	in     *testutil.Instance
	client *testbed.Pod
	host   *testbed.Pod
	back   []*testbed.Pod
	dir    string
}

func newLBBed(t *testing.T, settings ...string) *lbBed {
	b := testutil.Bed(t)
	lb := &lbBed{bed: b, in: testutil.NewInstance(t), dir: t.TempDir()}
	lb.in.Settings = append(lb.in.Settings, settings...)
	lb.client = testutil.Pod(t, b, "client")
	lb.host = testutil.HostPod(t, b, "host")
	for _, name := range []string{"be0", "be1"} {
		p := testutil.Pod(t, b, name)
		lb.back = append(lb.back, p)
		for _, network := range []string{"tcp", "udp"} {
			start(t, p, lb.in.Bin, "peer", "whoami", "[::]:8080", "--network", network, "--label", name)
		}
		waitPort(t, p, "[::]:8080")
	}
	lb.in.Attach(append([]*testbed.Pod{lb.client, lb.host}, lb.back...)...)
	return lb
}

// writeServices writes a service file and returns its path.
func (lb *lbBed) writeServices(t *testing.T, yaml string) string {
	t.Helper()
	f := filepath.Join(lb.dir, "services.yaml")
	if err := os.WriteFile(f, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func (lb *lbBed) apply(t *testing.T, yaml string) string {
	t.Helper()
	return lb.in.MustRun("svc", "apply", "-f", lb.writeServices(t, yaml))
}

func (lb *lbBed) probe(t *testing.T, from *testbed.Pod, mode, target string, count int) *peer.LBProbe {
	t.Helper()
	return probeFrom(t, lb.in, from, mode, target, count)
}

// probeFrom runs `peer lbprobe` in a pod: count connects (or sends) to
// target over mode, with what answered and whether the peer showed as
// target.
func probeFrom(t *testing.T, in *testutil.Instance, from *testbed.Pod, mode, target string, count int) *peer.LBProbe {
	t.Helper()
	cmd, err := from.Command(in.Bin, "peer", "lbprobe", target, "--mode", mode, "--count", fmt.Sprint(count))
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("lbprobe %s %s: %v", mode, target, err)
	}
	var r peer.LBProbe
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("parsing %q: %v", out, err)
	}
	return &r
}

func (lb *lbBed) lbCounters(t *testing.T) map[string]uint64 {
	t.Helper()
	return lbCountersOf(t, lb.in)
}

// routeVIPsNowhere makes the pods' connects to a service address nobody
// translates fail at once instead of leaving the machine.
func routeVIPsNowhere(t *testing.T, pods ...*testbed.Pod) {
	t.Helper()
	for _, p := range pods {
		if err := p.RouteNowhere("198.19.0.0/16"); err != nil {
			t.Fatal(err)
		}
	}
}

// serverClient starts an instance loaded with settings (flags and values)
// and attaches it to two new pods of a new bed, a server's and a client's.
func serverClient(t *testing.T, settings ...string) (b *testbed.Bed, in *testutil.Instance, srv, cli *testbed.Pod) {
	t.Helper()
	b = testutil.Bed(t)
	in = testutil.NewInstance(t)
	in.Settings = append(in.Settings, settings...)
	srv, cli = testutil.Pod(t, b, "server"), testutil.Pod(t, b, "client")
	in.Attach(srv, cli)
	return b, in, srv, cli
}
