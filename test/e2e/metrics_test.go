package e2e

import (
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/testutil"
)

// TestAgentMetrics scrapes the agent's /metrics during and after a pod to
// pod transfer of known size: the exposition parses with the Prometheus
// text parser and the redirected-bytes counter matches the bytes sent.
func TestAgentMetrics(t *testing.T) {
	b := testutil.Bed(t)
	in := testutil.NewInstance(t)
	client, server := testutil.Pod(t, b, "client"), testutil.Pod(t, b, "server")
	addr := testutil.FreeAddr(t)
	var logs lockedBuffer
	// Verdict window 0: every send is counted at its own verdict, so the
	// byte counter is exact rather than up to one window behind.
	// The instance's settings (--bypass on): the metrics are checked
	// against bypassed bytes on every kernel, whatever auto would decide.
	args := append([]string{"--name", in.Name, "agent", "--cgroup", client.Cgroup, "--cgroup", server.Cgroup,
		"--metrics-address", addr, "--bpf-stats", "--verdict-window", "0", "--backlog-limit", "67108864", "--blocking-sockets", "per-process"}, in.Settings...)
	agent := exec.Command(in.Bin, args...)
	agent.Stdout, agent.Stderr = &logs, &logs
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = agent.Process.Signal(syscall.SIGTERM)
		_ = agent.Wait()
	})
	base := "http://" + addr
	waitFor(t, func() bool { code, _, err := httpGet(base + "/readyz"); return err == nil && code == 200 })
	if code, body, err := httpGet(base + "/healthz"); err != nil || code != 200 {
		t.Fatalf("/healthz: %d %q %v", code, body, err)
	}
	scrape := func() map[string]float64 {
		t.Helper()
		code, body, err := httpGet(base + "/metrics")
		if err != nil || code != 200 {
			t.Fatalf("/metrics: %d %v", code, err)
		}
		m, err := testutil.ParseMetrics(body)
		if err != nil {
			t.Fatalf("/metrics does not parse: %v\n%s", err, body)
		}
		return m
	}
	before := scrape()
	for _, name := range []string{"socklane_build_info", "socklane_bypassed_sockets", "socklane_collection_errors_total", "process_cpu_seconds_total"} {
		found := false
		for k := range before {
			if k == name || strings.HasPrefix(k, name+",") {
				found = true
			}
		}
		if !found {
			t.Errorf("no %s in /metrics", name)
		}
	}

	const size, count = 65536, 400 // 26 MB
	start(t, server, in.Bin, "peer", "sink", "0.0.0.0:7100")
	waitPort(t, server, "0.0.0.0:7100")
	cmd, err := client.Command(in.Bin, "peer", "stream", fmt.Sprintf("%s:7100", server.IPv4), "--size", fmt.Sprint(size), "--count", fmt.Sprint(count))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() { out, err := cmd.CombinedOutput(); done <- result{out, err} }()
	// Scrape while the transfer runs: the counter only grows.
	last := before["socklane_redirected_bytes_total"]
	for running := true; running; {
		select {
		case r := <-done:
			if r.err != nil {
				t.Fatalf("peer stream: %v: %s", r.err, r.out)
			}
			running = false
		case <-time.After(20 * time.Millisecond):
			now := scrape()["socklane_redirected_bytes_total"]
			if now < last {
				t.Fatalf("redirected bytes went down: %v -> %v", last, now)
			}
			last = now
		}
	}
	after := scrape()
	// The stream's bytes one way, and the sink's 8-byte count back:
	// redirected, or passed to TCP by the valve while the sink caught up.
	want := float64(size*count + 8)
	redirected := after["socklane_redirected_bytes_total"] - before["socklane_redirected_bytes_total"]
	valved := after["socklane_valve_passed_bytes_total"] - before["socklane_valve_passed_bytes_total"]
	if redirected+valved != want {
		t.Errorf("socklane_redirected_bytes_total moved by %v and socklane_valve_passed_bytes_total by %v, want %v in all (the bytes sent)", redirected, valved, want)
	}
	if passed := after["socklane_passed_bytes_total"] - before["socklane_passed_bytes_total"]; passed != valved {
		t.Errorf("socklane_passed_bytes_total moved by %v, want the valve's %v", passed, valved)
	}
	if d := after["socklane_connections_decided_total,path=bypass"] - before["socklane_connections_decided_total,path=bypass"]; d != 1 {
		t.Errorf("bypassed connections moved by %v, want 1", d)
	}
	if after["socklane_bpf_program_runs_total,program=sl_msg"] == 0 || after["socklane_bpf_program_run_seconds_total,program=sl_msg"] <= 0 {
		t.Errorf("no BPF run-time statistics for sl_msg with --bpf-stats")
	}
	for setting, want := range map[string]float64{"verdict_window_bytes": 0, "backlog_limit_bytes": 64 << 20, "bypass_blocking": 0.5, "bypass_brief": 0} {
		if got, ok := after["socklane_datapath_setting,setting="+setting]; !ok || got != want {
			t.Errorf("socklane_datapath_setting{setting=%q} = %v (present %v), want %v (the agent's flags and defaults)", setting, got, ok, want)
		}
	}
	if after["socklane_collection_errors_total"] != 0 {
		t.Errorf("collection errors: %v; agent log:\n%s", after["socklane_collection_errors_total"], logs.String())
	}
}
