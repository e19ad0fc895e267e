package e2e

import (
	"encoding/json"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/cri"
	"github.com/socklane/socklane/internal/testutil"
)

// TestCRIPods: pods of a real containerd, attached by namespace/name
// through the CRI; traffic between two attached pods is bypassed, a third
// pod's stays on TCP; `pods` tells which are managed; the agent's standing
// selector attaches a pod that starts later and drops it when it goes.
func TestCRIPods(t *testing.T) {
	rt := testutil.StartContainerd(t)
	in := testutil.NewInstance(t)
	rt.RunPod("default", "server", map[string]string{"app": "web"}, testutil.ContainerSpec{Name: "echo", Args: []string{"peer", "echo", "0.0.0.0:7000"}})
	rt.RunPod("default", "client", map[string]string{"app": "web"}, testutil.ContainerSpec{Name: "shell", Args: []string{"peer", "pause"}})
	rt.RunPod("other", "stranger", map[string]string{"app": "other"}, testutil.ContainerSpec{Name: "shell", Args: []string{"peer", "pause"}})
	pods := criPods(t, rt)
	server, client, stranger := pods["default/server"], pods["default/client"], pods["other/stranger"]
	for _, p := range []cri.Pod{server, client, stranger} {
		if p.Cgroup == "" || p.IP == "" || len(p.Containers) != 1 || p.Containers[0].PID == 0 {
			t.Fatalf("pod not resolved through the CRI: %+v", p)
		}
	}

	in.MustRun("attach", "--pod", "default/server", "--cri-socket", rt.Socket)
	in.MustRun("attach", "--pod", "default/client", "--container", "shell", "--cri-socket", rt.Socket)
	if out, err := in.Run("attach", "--pod", "default/nope", "--cri-socket", rt.Socket); err == nil || !strings.Contains(out, "no running pod default/nope") {
		t.Errorf("attach to an unknown pod: %v: %s", err, out)
	}
	if out, err := in.Run("attach", "--pod", "default/client", "--container", "nope", "--cri-socket", rt.Socket); err == nil || !strings.Contains(out, "has no container nope") {
		t.Errorf("attach to an unknown container: %v: %s", err, out)
	}

	pingpong := func(from cri.Pod) map[string]uint64 {
		t.Helper()
		before := in.Counters()
		out, err := rt.Exec(from.Containers[0].ID, 30*time.Second, "/socklane", "peer", "pingpong", server.IP+":7000", "--size", "100", "--count", "300", "--warmup", "0")
		if err != nil {
			t.Fatalf("pingpong from %s: %v: %s", from.Key(), err, out)
		}
		return testutil.Delta(before, in.Counters())
	}
	d := pingpong(client)
	mustEqual(t, d, "conns_bypassed", 1)
	mustAtLeast(t, d, "redirect_bytes", 2*300*100)
	d = pingpong(stranger)
	mustEqual(t, d, "conns_bypassed", 0)
	mustEqual(t, d, "redirect_msgs", 0)

	m := managedPods(t, in, rt.Socket)
	if !m["default/server"] || !m["default/client"] || m["other/stranger"] {
		t.Errorf("pods managed: %v", m)
	}

	t.Run("standing selector", func(t *testing.T) {
		in2 := testutil.NewInstance(t)
		var logs lockedBuffer
		agent := exec.Command(in2.Bin, "--name", in2.Name, "agent", "--pod-selector", "app=web", "--cri-socket", rt.Socket,
			"--pod-interval", "200ms", "--metrics-address", "")
		agent.Stdout, agent.Stderr = &logs, &logs
		if err := agent.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = agent.Process.Signal(syscall.SIGTERM); _ = agent.Wait() }()
		waitForLog(t, &logs, func() bool {
			m := managedPods(t, in2, rt.Socket)
			return m["default/server"] && m["default/client"]
		})
		id := rt.RunPod("default", "late", map[string]string{"app": "web"}, testutil.ContainerSpec{Name: "shell", Args: []string{"peer", "pause"}})
		waitForLog(t, &logs, func() bool { return managedPods(t, in2, rt.Socket)["default/late"] })
		if m := managedPods(t, in2, rt.Socket); m["other/stranger"] {
			t.Errorf("the selector attached a pod it does not match: %v", m)
		}
		var st struct {
			Attachments []struct {
				ID uint64 `json:"cgroup_id"`
			} `json:"attachments"`
		}
		count := func() int {
			if err := json.Unmarshal([]byte(in2.MustRun("status", "-o", "json")), &st); err != nil {
				t.Fatal(err)
			}
			return len(st.Attachments)
		}
		if n := count(); n != 3 {
			t.Fatalf("%d attachments with three matching pods, want 3", n)
		}
		rt.RemovePod(id)
		waitForLog(t, &logs, func() bool { return count() == 2 })
		if !strings.Contains(logs.String(), "pod gone: detached") || !strings.Contains(logs.String(), "pod=default/late") {
			t.Errorf("agent log does not tell the pod went:\n%s", logs.String())
		}
	})
}

// waitForLog is waitFor that shows a process's log when it gives up.
