package e2e

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPortsAgentRestart: the agent applies a ports file; SIGKILLed, it
// leaves the live mappings as they are (bound copies reachable, their
// real ports held, nothing handed out twice) and a new agent adopts them;
// a file edit is applied live, a bad edit refused with the rules kept.
func TestPortsAgentRestart(t *testing.T) {
	pb := newPortBed(t)
	file := pb.rules(t, sideBySide)
	agent := func() *exec.Cmd {
		cmd, _, _ := background(t, pb.in, "port rules applied", "agent", "--cgroup", pb.c.Cgroup, "--metrics-address", "", "--ports", file)
		return cmd
	}
	first := agent()
	ba, _ := pb.bindShow(t, pb.a, "a", "tcp4:0.0.0.0:3000")
	mustBind(t, ba, ":3000")
	before, _ := pb.list(t).real("wa", "TCP", 3000)
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	// With no agent: the mapping lives on in the kernel.
	if r := probeFrom(t, pb.in, pb.a, "tcp", "127.0.0.1:3000", 3); r.Replies["a 3000"] != 3 {
		t.Errorf("with the agent killed, wa's client got %v", r.Replies)
	}
	bb, _ := pb.bindShow(t, pb.b, "b", "tcp4:0.0.0.0:3000")
	mustBind(t, bb, ":3000")
	agent()
	l := pb.list(t)
	after, _ := l.real("wa", "TCP", 3000)
	rb, _ := l.real("wb", "TCP", 3000)
	if after != before || rb == 0 || rb == after {
		t.Errorf("after the restart: wa holds %d (had %d), wb %d", after, before, rb)
	}
	if r := probeFrom(t, pb.in, pb.c, "tcp", "127.0.0.1:3000", 3); r.Replies["b 3000"] != 3 {
		t.Errorf("the route after the restart: %v", r.Replies)
	}
	// A live edit: the route now names wa.
	edited := strings.Replace(sideBySide, "- {port: 3000, to: wb}", "- {port: 3000, to: wa}", 1)
	if err := os.WriteFile(file+".new", []byte(strings.NewReplacer("%A", pb.a.Cgroup, "%B", pb.b.Cgroup).Replace(edited)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(file+".new", file); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		return probeFrom(t, pb.in, pb.c, "tcp", "127.0.0.1:3000", 1).Replies["a 3000"] == 1
	})
	// A bad edit is refused; what was applied stays.
	if err := os.WriteFile(file, []byte("workloads:\n  - name: Bad_Name\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond)
	if r := probeFrom(t, pb.in, pb.c, "tcp", "127.0.0.1:3000", 2); r.Replies["a 3000"] != 2 {
		t.Errorf("after a bad edit, the route gave %v", r.Replies)
	}
}

// TestPortsBadRules: a bad file (each problem named with its line), a pool
// the kernel hands out as ephemeral ports, a missing cgroup, a workload
// over the datapath's limits: refused with a non-zero exit before
// anything changes (the applied rules and the maps stay as they were).
func TestPortsBadRules(t *testing.T) {
	pb := newPortBed(t)
	pb.apply(t, sideBySide)
	entries := func() [3]int {
		return [3]int{pb.in.MapEntries("sl_pt_vports"), pb.in.MapEntries("sl_pt_cgroups"), pb.in.MapEntries("sl_pt_vindex")}
	}
	want := entries()
	rules := pb.in.MustRun("ports", "list", "-o", "json")
	for _, tc := range []struct {
		name, yaml, msg string
	}{
		{"unknown field", "workloads:\n  - name: wa\n    cgroup: %A\n    portz: []\n", "line 4"},
		{"bad name", "workloads:\n  - name: Wa\n    cgroup: %A\n    ports: [{port: 3000}]\n    pool: 21000-21009\n", "line 2: workloads[0].name"},
		{"no selector", "workloads:\n  - name: wa\n    ports: [{port: 3000}]\n    pool: 21000-21009\n", "give exactly one of cgroup, pid, pod or selector"},
		{"bad protocol", "workloads:\n  - name: wa\n    cgroup: %A\n    ports: [{port: 3000, protocol: SCTP}]\n    pool: 21000-21009\n", "want TCP or UDP"},
		{"pool overlaps virtual", "workloads:\n  - name: wa\n    cgroup: %A\n    ports: [{port: 21005}]\n    pool: 21000-21009\n", "a pool holds real ports only"},
		{"bad range", "workloads:\n  - name: wa\n    cgroup: %A\n    ports: [{port: 3000-2000}]\n    pool: 21000-21009\n", "line 4"},
		{"route to nothing", "workloads:\n  - name: wa\n    cgroup: %A\n    ports: [{port: 3000}]\n    pool: 21000-21009\nroutes:\n  - {port: 3001, to: wa}\n", "has no virtual port 3001/TCP"},
		{"ephemeral pool", "workloads:\n  - name: wa\n    cgroup: %A\n    ports: [{port: 3000}]\n    pool: 40000-40009\n", "ip_local_port_range"},
		{"missing cgroup", "workloads:\n  - name: wa\n    cgroup: /sys/fs/cgroup/does/not/exist\n    ports: [{port: 3000}]\n    pool: 21000-21009\n", "workload wa"},
		{"pools too large together", "workloads:\n  - {name: wa, cgroup: %A, ports: [{port: 80}], pool: 1024-17407}\n  - {name: wb, cgroup: %B, ports: [{port: 80}], pool: 17408-32767}\n  - {name: wc, cgroup: %C, ports: [{port: 80}], pool: 61000-65535}\n", "at most 32768"},
		{"pool too large", "workloads:\n  - name: wa\n    cgroup: %A\n    ports: [{port: 80}]\n    pool: 1024-32000\n", "at most 16384"},
	} {
		out, err := pb.in.Run("ports", "apply", "-f", pb.rules(t, tc.yaml))
		if err == nil || !strings.Contains(out, tc.msg) {
			t.Errorf("%s: exit %v, output %q; want a refusal naming %q", tc.name, err, out, tc.msg)
		}
	}
	if got := entries(); got != want {
		t.Errorf("map entries after refusals %v, before %v", got, want)
	}
	if got := pb.in.MustRun("ports", "list", "-o", "json"); got != rules {
		t.Errorf("the applied rules changed:\n%s\nwas\n%s", got, rules)
	}
}
