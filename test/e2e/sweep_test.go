package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/testutil"
)

// TestDetachReclaimsSlots: bypassed connections whose cgroups are detached
// close unseen by the datapath. Their connection slots, index entries and
// socket pointers come back through the agent's sweep once both ends are
// closed, and not while they are open; the slots then serve new
// connections.
func TestDetachReclaimsSlots(t *testing.T) {
	b := testutil.Bed(t)
	in := testutil.NewInstance(t)
	srv, cli, other := testutil.Pod(t, b, "server"), testutil.Pod(t, b, "client"), testutil.Pod(t, b, "other")
	in.Attach(srv, cli)
	const n = 200
	start(t, srv, in.Bin, "peer", "sink", "0.0.0.0:7300")
	waitPort(t, srv, "0.0.0.0:7300")
	before := in.Counters()
	holder := start(t, cli, in.Bin, "peer", "open", "--ports", "7300", "--count", fmt.Sprint(n), srv.IPv4.String())
	inUse := func() int {
		var rows []json.RawMessage
		if err := json.Unmarshal([]byte(in.MustRun("conns", "-o", "json")), &rows); err != nil {
			t.Fatal(err)
		}
		return len(rows)
	}
	waitFor(t, func() bool { return inUse() == n })
	mustAtLeast(t, testutil.Delta(before, in.Counters()), "conns_bypassed", n)
	in.MustRun("detach", "--cgroup", srv.Cgroup)
	in.MustRun("detach", "--cgroup", cli.Cgroup)

	// An agent sweeping every 100 ms (attached to a third pod only).
	var logs lockedBuffer
	agent := exec.Command(in.Bin, "--name", in.Name, "agent", "--cgroup", other.Cgroup, "--metrics-address", "", "--sweep-interval", "100ms")
	agent.Stdout, agent.Stderr = &logs, &logs
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = agent.Process.Signal(syscall.SIGTERM); _ = agent.Wait() })
	waitForLog(t, &logs, func() bool { return strings.Contains(logs.String(), "agent running") })
	// Open connections keep their slots through many sweeps.
	time.Sleep(time.Second)
	if got := inUse(); got != n {
		t.Fatalf("%d slots in use with %d detached connections open, want %d (a live slot was reclaimed)\n%s", got, n, n, logs.String())
	}
	// Closed unseen: both ends go, the sweep returns every slot.
	_ = holder.cmd.Process.Kill()
	_ = holder.cmd.Wait()
	waitFor(t, func() bool { return inUse() == 0 })
	if !strings.Contains(logs.String(), "connection slots reclaimed") {
		t.Errorf("the agent did not log the reclaim:\n%s", logs.String())
	}
	left := in.MapEntries("sl_conn_index")
	if left != 0 {
		t.Errorf("%d index entries left after the reclaim", left)
	}
	// The slots serve again.
	in.Attach(srv, cli)
	before = in.Counters()
	holder = start(t, cli, in.Bin, "peer", "open", "--ports", "7300", "--count", "20", srv.IPv4.String())
	waitFor(t, func() bool { return inUse() == 20 })
	d := testutil.Delta(before, in.Counters())
	mustAtLeast(t, d, "conns_bypassed", 20)
	mustEqual(t, d, "err_conn_table_full", 0)
	mustEqual(t, d, "err_sockhash", 0)
	_ = holder.cmd.Process.Kill()
}
