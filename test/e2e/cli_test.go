package e2e

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/sockbugs"
	"github.com/socklane/socklane/internal/testutil"
)

// TestBadInput: each bad input gets a clear error naming the fix, a
// non-zero exit, and leaves nothing attached or pinned.
func TestBadInput(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Binary(t)
	notBPF := t.TempDir()
	tests := []struct {
		name string
		cmd  func() *exec.Cmd
		want string
	}{
		{"missing cgroup", func() *exec.Cmd {
			return exec.Command(bin, "--name", "slbad", "attach", "--cgroup", "/sys/fs/cgroup/unified/does-not-exist-sl")
		}, "give an existing cgroup v2 directory"},
		{"missing pid", func() *exec.Cmd { return exec.Command(bin, "--name", "slbad", "attach", "--pid", "999999999") }, "process 999999999 does not exist"},
		{"no target", func() *exec.Cmd { return exec.Command(bin, "--name", "slbad", "attach") }, "exactly one of --cgroup"},
		{"no bpffs", func() *exec.Cmd { return exec.Command(bin, "--bpffs", notBPF, "status") }, "no bpf filesystem at"},
		{"not running", func() *exec.Cmd { return exec.Command(bin, "--name", "slbad-none", "status") }, "socklane is not running"},
		{"verdict window too large", func() *exec.Cmd {
			return exec.Command(bin, "--name", "slbad", "attach", "--cgroup", "/", "--verdict-window", "4194304")
		}, `"4194304" for "--verdict-window" flag: want at most 1048576 bytes`},
		{"bad blocking mode", func() *exec.Cmd {
			return exec.Command(bin, "--name", "slbad", "attach", "--cgroup", "/", "--blocking-sockets", "maybe")
		}, `"maybe" for "--blocking-sockets" flag: want one of auto, bypass, tcp, per-process`},
		{"brief connections have no auto", func() *exec.Cmd {
			return exec.Command(bin, "--name", "slbad", "agent", "--brief-connections", "auto")
		}, `"auto" for "--brief-connections" flag: want one of bypass, tcp`},
		{"bad output", func() *exec.Cmd { return exec.Command(bin, "-o", "yaml", "status") }, "unknown output format"},
		{"empty name", func() *exec.Cmd { return exec.Command(bin, "--name", "", "down", "--force") }, `--name "": an instance name is`},
		{"name with a path", func() *exec.Cmd { return exec.Command(bin, "--name", "../sys", "down", "--force") }, "an instance name is"},
		{"name dot", func() *exec.Cmd { return exec.Command(bin, "--name", ".", "status") }, "an instance name is"},
		{"down of no instance", func() *exec.Cmd { return exec.Command(bin, "--name", "slbad-none", "down") }, `no socklane instance "slbad-none"`},
		{"not root", func() *exec.Cmd {
			c := exec.Command(bin, "--name", "slbad", "attach", "--cgroup", "/")
			c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
			return c
		}, "must run as root"},
		{"no cgroup2", func() *exec.Cmd {
			// A private mount namespace without the cgroup v2 mount.
			return exec.Command("unshare", "-m", "sh", "-c",
				"for m in $(awk '$3==\"cgroup2\"{print $2}' /proc/mounts); do umount -l $m; done; exec "+bin+" --name slbad agent")
		}, "no cgroup v2 filesystem is mounted"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := tt.cmd().CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("want a non-zero exit, got %v: %s", err, out)
			}
			if !strings.Contains(string(out), tt.want) {
				t.Fatalf("error %q does not say %q", out, tt.want)
			}
			for _, name := range []string{"slbad", "slbad-none"} {
				if _, err := os.Stat(filepath.Join("/sys/fs/bpf", name, "prog_sl_msg")); err == nil {
					t.Fatalf("%s left a pinned datapath behind", name)
				}
			}
		})
	}
}

// TestAgentRestartAndDown: SIGKILL and restart the agent in the middle of
// transfers, then `down` while connections are live: no stream loses a
// byte, down refuses to unpin until they drain.
func TestAgentRestartAndDown(t *testing.T) {
	b := testutil.Bed(t)
	in := testutil.NewInstance(t)
	srv, cli := testutil.Pod(t, b, "server"), testutil.Pod(t, b, "client")
	agentCmd := func() *exec.Cmd {
		c := exec.Command(in.Bin, append([]string{"--name", in.Name, "agent", "--cgroup", srv.Cgroup, "--cgroup", cli.Cgroup}, in.Settings...)...)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := agentCmd()
	waitFor(t, func() bool { _, err := in.Run("status"); return err == nil })
	check := "--check-fionread=" + strconv.FormatBool(!fionreadBypassed(t, in))
	// Where sk_psock does not count queued bytes (6.1), a reader slower
	// than its sender gets no backpressure: redirected bytes pile up until
	// TCP memory is under pressure and writes fail with ENOMEM (why
	// --bypass auto is off there). Smaller streams keep this test about
	// restart and down.
	size, slow := "20000000", "5000000"
	if !readStatus(t, in).Kernel.PsockMsgTotLen {
		size, slow = "2000000", "500000"
	}
	server := start(t, srv, in.Bin, "peer", "integrity-server", "0.0.0.0:9000", "--conns", "8", "--io", "epoll", "--bytes", size, "--max-msg", "65536", check)
	waitPort(t, srv, "0.0.0.0:9000")
	client := start(t, cli, in.Bin, "peer", "integrity-client", srv.IPv4.String()+":9000", "--conns", "8", "--io", "epoll", "--bytes", size, "--max-msg", "65536", "--slow-bytes", slow, check)
	time.Sleep(300 * time.Millisecond)
	_ = a.Process.Kill() // SIGKILL mid-transfer
	_ = a.Wait()
	a = agentCmd() // adopts the pinned datapath
	time.Sleep(200 * time.Millisecond)
	_ = a.Process.Signal(syscall.SIGTERM)
	_ = a.Wait()
	cerr := client.wait(t, 5*time.Minute)
	serr := server.wait(t, time.Minute)
	csum, cfail := results(t, client.out.String())
	ssum, sfail := results(t, server.out.String())
	if cerr != nil || serr != nil || len(cfail)+len(sfail) > 0 || csum.Conns != 8 || ssum.Conns != 8 {
		t.Fatalf("streams failed across restart/down: %v %v %v %v", cerr, serr, cfail, sfail)
	}
	d := in.Counters()
	if d["conns_bypassed"] < 6 || d["redirect_bytes"] < csum.Sent/2 {
		t.Errorf("transfers were not bypassed: %v", nonzero(d))
	}
	// down while a bypassed connection is live: detaches, waits, gives
	// up without unpinning, and the connection keeps working.
	in.Attach(srv, cli)
	base := in.Counters()
	echo := start(t, srv, in.Bin, "peer", "echo", "0.0.0.0:7000")
	waitPort(t, srv, "0.0.0.0:7000")
	// Far more round trips than the test lasts: the connection is live
	// through down, and ended by the test.
	pp := start(t, cli, in.Bin, "peer", "pingpong", srv.IPv4.String()+":7000", "--size", "1000", "--count", "100000000", "--warmup", "0")
	waitFor(t, func() bool { c := in.Counters(); return c["redirect_bytes"] > base["redirect_bytes"]+100*1000 })
	out, err := in.Run("down", "--drain-timeout", "300ms")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 || !strings.Contains(out, "still open") {
		t.Fatalf("down during a live connection: want exit 3 and a drain message, got %v: %s", err, out)
	}
	// Still bypassed after the refused down.
	after := in.Counters()
	waitFor(t, func() bool { c := in.Counters(); return c["redirect_bytes"] > after["redirect_bytes"]+100*1000 })
	if pp.cmd.ProcessState != nil {
		t.Fatalf("ping-pong ended across down: %s", pp.err.String())
	}
	for _, p := range []*proc{pp, echo} {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
	// Drained: now down removes everything.
	in.MustRun("down", "--drain-timeout", "10s")
	if _, err := os.Stat(filepath.Join("/sys/fs/bpf", in.Name)); err == nil {
		t.Fatal("pin directory left after down")
	}
}

// TestDemo runs the README's main command at a small size: it must keep
// working as the datapath changes (it checks the kernel's counters itself).
func TestDemo(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Binary(t)
	out, err := exec.Command(bin, "demo", "--rounds", "1", "--count", "300", "--sizes", "1,4096").CombinedOutput()
	if err != nil {
		t.Fatalf("socklane demo: %v\n%s", err, out)
	}
	for _, want := range []string{"bypass mean us", "bytes redirected socket to socket"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
}

// TestSettingsFixedAtLoad: a running datapath keeps the settings it was
// loaded with. status shows them; an attach that asks for others is
// refused with the fix and attaches nothing; the same values, or none,
// attach.
func TestSettingsFixedAtLoad(t *testing.T) {
	b := testutil.Bed(t)
	in := testutil.NewInstance(t)
	first, second := testutil.Pod(t, b, "first"), testutil.Pod(t, b, "second")
	in.MustRun("attach", "--cgroup", first.Cgroup, "--verdict-window", "0", "--blocking-sockets", "bypass", "--backlog-limit", "2097152")
	type attachment struct {
		CgroupID uint64 `json:"cgroup_id"`
	}
	type status struct {
		Settings struct {
			BacklogLimit   uint32 `json:"backlog-limit"`
			VerdictWindow  uint32 `json:"verdict-window"`
			BypassBlocking string `json:"blocking-sockets"`
			BypassBrief    string `json:"brief-connections"`
		} `json:"settings"`
		Attachments []attachment `json:"attachments"`
	}
	read := func() status {
		t.Helper()
		var st status
		if err := json.Unmarshal([]byte(in.MustRun("status", "-o", "json")), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	st := read()
	if s := st.Settings; s.VerdictWindow != 0 || s.BypassBlocking != "bypass" || s.BypassBrief != "tcp" || s.BacklogLimit != 2097152 {
		t.Fatalf("status settings %+v, want what the first attach loaded", s)
	}
	for _, tc := range []struct {
		args []string
		want string // refusal; "" attaches
	}{
		{[]string{"--verdict-window", "4096"}, "--verdict-window 4096: the datapath running in"},
		{[]string{"--blocking-sockets", "tcp"}, "was loaded with --blocking-sockets bypass"},
		{[]string{"--backlog-limit", "1048576"}, "was loaded with --backlog-limit 2097152"},
		{[]string{"--verdict-window", "0", "--blocking-sockets", "bypass"}, ""},
		{nil, ""},
	} {
		out, err := in.Run(append([]string{"attach", "--cgroup", second.Cgroup}, tc.args...)...)
		attached := slices.Contains(read().Attachments, attachment{second.CgroupID})
		if tc.want == "" {
			if err != nil || !attached {
				t.Errorf("attach %v: %v, attached %v: %s", tc.args, err, attached, out)
			}
			continue
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() == 0 || !strings.Contains(out, tc.want) || !strings.Contains(out, "socklane down") {
			t.Errorf("attach %v: want a non-zero exit saying %q and the fix, got %v: %s", tc.args, tc.want, err, out)
		}
		if attached {
			t.Errorf("attach %v was refused, yet the cgroup got attached", tc.args)
		}
	}
	if s := read().Settings; s.VerdictWindow != 0 || s.BypassBlocking != "bypass" || s.BacklogLimit != 2097152 {
		t.Errorf("settings changed to %+v", s)
	}
}

// fionreadBypassed: the datapath bypasses connections on a kernel whose
// FIONREAD answers 0 for redirected bytes.
func fionreadBypassed(t *testing.T, in *testutil.Instance) bool {
	t.Helper()
	st := readStatus(t, in)
	return st.Settings.Bypass.On() && st.Kernel.Has(sockbugs.FIONREAD)
}
