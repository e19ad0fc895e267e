package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestAgentServiceFile: the agent applies its service file at start, again
// when the file changes (written in place or replaced by a rename), keeps
// the applied services when a change is invalid, and refuses to start on an
// invalid file.
func TestAgentServiceFile(t *testing.T) {
	lb := newLBBed(t)
	be0, be1 := lb.back[0], lb.back[1]
	file := filepath.Join(lb.dir, "agent-services.yaml")
	write := func(body string) {
		t.Helper()
		tmp := file + ".new"
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	svc := func(ip fmt.Stringer) string {
		return fmt.Sprintf("services:\n  - name: who\n    vips: [198.19.0.10]\n    ports: [{port: 80, targetPort: 8080}]\n    backends: [{ip: %s}]\n", ip)
	}
	write(svc(be0.IPv4))

	var logs lockedBuffer
	agent := exec.Command(lb.in.Bin, "--name", lb.in.Name, "agent", "--cgroup", lb.client.Cgroup,
		"--services", file, "--services-interval", "100ms")
	agent.Stdout, agent.Stderr = &logs, &logs
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- agent.Wait() }()
	t.Cleanup(func() {
		if agent.ProcessState == nil {
			_ = agent.Process.Kill()
			t.Logf("agent stopped: %v", <-exited)
		}
	})

	// waitFor probes the VIP until every reply comes from backend.
	waitFor := func(backend string, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for time.Since(start) < within {
			out, _ := lb.in.Run("svc", "list")
			if strings.Contains(out, "default/who") {
				r := lb.probe(t, lb.client, "tcp", "198.19.0.10:80", 4)
				if r.Replies[backend] == 4 {
					return time.Since(start)
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("the VIP did not move to %s within %s; agent log:\n%s", backend, within, logs.String())
		return 0
	}
	waitFor("be0", 15*time.Second)

	write(svc(be1.IPv4))
	took := waitFor("be1", 5*time.Second)
	t.Logf("a changed service file reached the datapath in %s", took)

	// In-place edit, invalid: logged, nothing changes.
	if err := os.WriteFile(file, []byte("services:\n  - name: who\n    vips: [198.19.0.300]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond)
	if r := lb.probe(t, lb.client, "tcp", "198.19.0.10:80", 4); r.Replies["be1"] != 4 {
		t.Errorf("after an invalid edit the VIP answered %v %v", r.Replies, r.Errors)
	}
	if !strings.Contains(logs.String(), "service file refused") || strings.Count(logs.String(), "service file refused") != 1 {
		t.Errorf("want the invalid file logged once; agent log:\n%s", logs.String())
	}

	// A bad file at start: the second agent exits at once, naming the
	// line, and leaves the running state alone.
	out, err := lb.in.Run("agent", "--cgroup", lb.client.Cgroup, "--services", file)
	if err == nil || !strings.Contains(out, "line 3") {
		t.Errorf("agent with an invalid service file: %v: %s", err, out)
	}
	if r := lb.probe(t, lb.client, "tcp", "198.19.0.10:80", 4); r.Replies["be1"] != 4 {
		t.Errorf("after a refused agent start the VIP answered %v %v", r.Replies, r.Errors)
	}

	// Fixed again, in place.
	if err := os.WriteFile(file, []byte(svc(be0.IPv4)), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("be0", 5*time.Second)

	if err := agent.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("agent exit: %v; log:\n%s", err, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Errorf("agent did not stop on SIGTERM")
	}
}

// lockedBuffer collects a process's output while the test reads it.
