package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/peer"
	"github.com/socklane/socklane/internal/testbed"
	"github.com/socklane/socklane/internal/testutil"
)

// portBed is a datapath instance and host pods (cgroups in the node's own
// network namespace): workloads a and b, and c, a client elsewhere that
// the datapath is attached to.
type portBed struct {
	in      *testutil.Instance
	a, b, c *testbed.Pod
	dir     string
}

func newPortBed(t *testing.T, settings ...string) *portBed {
	t.Helper()
	bed := testutil.Bed(t)
	pb := &portBed{in: testutil.NewInstance(t), dir: t.TempDir()}
	pb.in.Settings = append(pb.in.Settings, settings...)
	pb.a = testutil.HostPod(t, bed, "pta")
	pb.b = testutil.HostPod(t, bed, "ptb")
	pb.c = testutil.HostPod(t, bed, "ptc")
	pb.in.Attach(pb.c)
	return pb
}

// rules writes a ports file (%A, %B, %C stand for the pods' cgroups).
func (pb *portBed) rules(t *testing.T, yaml string) string {
	t.Helper()
	yaml = strings.NewReplacer("%A", pb.a.Cgroup, "%B", pb.b.Cgroup, "%C", pb.c.Cgroup).Replace(yaml)
	f := filepath.Join(pb.dir, fmt.Sprintf("ports-%d.yaml", time.Now().UnixNano()))
	if err := os.WriteFile(f, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func (pb *portBed) apply(t *testing.T, yaml string) {
	t.Helper()
	pb.in.MustRun("ports", "apply", "-f", pb.rules(t, yaml))
}

// portList is `socklane ports list -o json`.
type portList struct {
	Ports []struct {
		Workload string `json:"workload"`
		Proto    string `json:"protocol"`
		Virtual  int    `json:"virtual"`
		Real     int    `json:"real"`
		Sockets  int    `json:"sockets"`
		Resting  bool   `json:"resting"`
	} `json:"ports"`
	Counters map[string]map[string]uint64 `json:"counters"`
}

func (pb *portBed) list(t *testing.T) portList {
	t.Helper()
	out := pb.in.MustRun("ports", "list", "-o", "json")
	var l portList
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("parsing ports list: %v\n%s", err, out)
	}
	return l
}

// real is the real port workload holds for virtual/proto (0: none).
func (l portList) real(workload, proto string, virtual int) (port, sockets int) {
	for _, p := range l.Ports {
		if p.Workload == workload && p.Proto == proto && p.Virtual == virtual && !p.Resting {
			return p.Real, p.Sockets
		}
	}
	return 0, 0
}

// bindShow starts `peer bindshow` in pod p and returns what it bound.
func (pb *portBed) bindShow(t *testing.T, p *testbed.Pod, label string, specs ...string) ([]peer.Bound, *exec.Cmd) {
	t.Helper()
	cmd, err := p.Command(pb.in.Bin, append([]string{"peer", "bindshow", "--label", label}, specs...)...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
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
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
	}()
	select {
	case l := <-line:
		var bs []peer.Bound
		if err := json.Unmarshal([]byte(l), &bs); err != nil {
			t.Fatalf("bindshow printed %q: %v", l, err)
		}
		return bs, cmd
	case <-time.After(20 * time.Second):
		t.Fatalf("bindshow %v printed nothing", specs)
	}
	return nil, nil
}

func stop(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
}

// listeningOn reports whether any TCP socket listens on port (the node's
// own network namespace, every process).
func listeningOn(t *testing.T, port int) bool {
	t.Helper()
	out, err := exec.Command("ss", "-Htln", fmt.Sprintf("sport = :%d", port)).Output()
	if err != nil {
		t.Fatalf("ss: %v", err)
	}
	return strings.TrimSpace(string(out)) != ""
}

func mustBind(t *testing.T, bs []peer.Bound, sockname string) {
	t.Helper()
	for _, b := range bs {
		if b.Error != "" {
			t.Fatalf("%s: bind failed: %s", b.Spec, b.Error)
		}
		if !strings.HasSuffix(b.Sockname, sockname) {
			t.Errorf("%s: getsockname shows %s, want port %s", b.Spec, b.Sockname, sockname)
		}
	}
}

const sideBySide = `workloads:
  - name: wa
    cgroup: %A
    ports: [{port: 3000}, {port: 3000, protocol: UDP}]
    pool: 21000-21009
  - name: wb
    cgroup: %B
    ports: [{port: 3000}, {port: 3000, protocol: UDP}]
    pool: 21000-21009
routes:
  - {port: 3000, to: wb}
  - {port: 3000, protocol: UDP, to: wb}
`

// TestPortsSideBySide: two cgroups in the node's network namespace both
// bind 0.0.0.0:3000, [::]:3000 and UDP 3000 at once; getsockname shows
// 3000, the kernel shows distinct real ports of the shared pool and
// nothing on 3000; each one's own clients reach it (TCP, connected and
// unconnected UDP, IPv4 and IPv6, the peer shown as 3000) and a client
// elsewhere reaches the copy the route names.
func TestPortsSideBySide(t *testing.T) {
	pb := newPortBed(t)
	pb.apply(t, sideBySide)
	specs := []string{"tcp4:0.0.0.0:3000", "tcp6:[::]:3000", "udp4:0.0.0.0:3000", "udp6:[::]:3000"}
	ba, _ := pb.bindShow(t, pb.a, "a", specs...)
	bb, _ := pb.bindShow(t, pb.b, "b", specs...)
	mustBind(t, ba, ":3000")
	mustBind(t, bb, ":3000")

	l := pb.list(t)
	ra, na := l.real("wa", "TCP", 3000)
	rb, nb := l.real("wb", "TCP", 3000)
	ua, _ := l.real("wa", "UDP", 3000)
	ub, _ := l.real("wb", "UDP", 3000)
	if ra == 0 || rb == 0 || ra == rb || ua == 0 || ub == 0 || ua == ub {
		t.Fatalf("real ports: wa TCP %d UDP %d, wb TCP %d UDP %d: want distinct ones per protocol\n%+v", ra, ua, rb, ub, l.Ports)
	}
	for _, r := range []int{ra, rb, ua, ub} {
		if r < 21000 || r > 21009 {
			t.Errorf("real port %d outside the pool 21000-21009", r)
		}
	}
	// IPv4 and IPv6 (IPv6-only) sockets of one copy share its real port.
	if na != 2 || nb != 2 {
		t.Errorf("sockets on the TCP real ports: wa %d, wb %d; want 2 each (IPv4 and IPv6)", na, nb)
	}
	if !listeningOn(t, ra) || !listeningOn(t, rb) {
		t.Errorf("the kernel shows no listener on the real ports %d, %d", ra, rb)
	}
	if listeningOn(t, 3000) {
		t.Errorf("something listens on port 3000 itself")
	}

	probeAll(t, pb.in, []probeCase{
		{pb.a, "tcp", "127.0.0.1:3000", "a 3000"},
		{pb.a, "tcp", "[::1]:3000", "a 3000"},
		{pb.b, "tcp", "127.0.0.1:3000", "b 3000"},
		{pb.b, "tcp", "[::1]:3000", "b 3000"},
		{pb.c, "tcp", "127.0.0.1:3000", "b 3000"},
		{pb.a, "udp", "127.0.0.1:3000", "a"},
		{pb.a, "udp-unconnected", "127.0.0.1:3000", "a"},
		{pb.a, "udp-unconnected", "[::1]:3000", "a"},
		{pb.b, "udp", "[::1]:3000", "b"},
		{pb.c, "udp-unconnected", "127.0.0.1:3000", "b"},
	})
	// UDP virtual ports: the hooks of unconnected datagrams are attached.
	if n := testutil.AttachedCount(t, pb.a.Cgroup, ebpf.AttachCGroupUDP4Sendmsg); n != 1 {
		t.Errorf("%d sendmsg4 programs on wa's cgroup, want 1 (rules with UDP ports)", n)
	}
	c := pb.list(t).Counters
	if c["wa"]["connects"] < 12 || c["wb"]["routed"] < 6 || c["wb"]["connects"] < 9 {
		t.Errorf("counters: wa %v, wb %v", c["wa"], c["wb"])
	}
	if c["wa"]["binds"] != 2 || c["wa"]["shared"] != 2 {
		t.Errorf("wa's binds: %v; want 2 drawn from the pool (TCP, UDP) and 2 shared (their IPv6 sockets)", c["wa"])
	}
}

// probeCase is a client in a pod probing a target, and the one answer
// every probe must get.
type probeCase struct {
	from   *testbed.Pod
	mode   string
	target string
	want   string
}

// probeAll runs each case three times: every answer is the wanted one and
// every peer shows the target asked for.
func probeAll(t *testing.T, in *testutil.Instance, cases []probeCase) {
	t.Helper()
	for _, tc := range cases {
		r := probeFrom(t, in, tc.from, tc.mode, tc.target, 3)
		if r.Replies[tc.want] != 3 || r.PeerMismatch != 0 {
			t.Errorf("%s/%s/%s: replies %v, peer mismatches %d (last peer %s), errors %v; want 3 x %q and the peer shown as asked for",
				tc.from.Name, tc.mode, tc.target, r.Replies, r.PeerMismatch, r.LastPeer, r.Errors, tc.want)
		}
	}
}

// TestPortsAddresses: a workload's own addresses reach its copy from
// anywhere socklane hooks (another workload, a client elsewhere), over
// TCP, connected and unconnected UDP, IPv4 and IPv6, the peer shown as
// the address and virtual port asked for; `ports hosts` names them.
func TestPortsAddresses(t *testing.T) {
	pb := newPortBed(t)
	pb.apply(t, `workloads:
  - name: wa
    cgroup: %A
    ports: [{port: 3000}, {port: 3000, protocol: UDP}]
    pool: 21500-21509
    addresses: [198.19.200.1]
  - name: wb
    cgroup: %B
    ports: [{port: 3000}, {port: 3000, protocol: UDP}]
    pool: 21500-21509
    addresses: [198.19.200.2, "2001:db8:200::2"]
`)
	specs := []string{"tcp4:0.0.0.0:3000", "tcp6:[::]:3000", "udp4:0.0.0.0:3000", "udp6:[::]:3000"}
	ba, _ := pb.bindShow(t, pb.a, "a", specs...)
	bb, _ := pb.bindShow(t, pb.b, "b", specs...)
	mustBind(t, ba, ":3000")
	mustBind(t, bb, ":3000")
	probeAll(t, pb.in, []probeCase{
		{pb.c, "tcp", "198.19.200.1:3000", "a 3000"},
		{pb.c, "tcp", "198.19.200.2:3000", "b 3000"},
		{pb.c, "tcp", "[2001:db8:200::2]:3000", "b 3000"},
		{pb.a, "tcp", "198.19.200.2:3000", "b 3000"},
		{pb.b, "tcp", "198.19.200.1:3000", "a 3000"},
		{pb.c, "udp", "198.19.200.1:3000", "a"},
		{pb.c, "udp-unconnected", "198.19.200.2:3000", "b"},
		{pb.a, "udp-unconnected", "[2001:db8:200::2]:3000", "b"},
	})
	if c := pb.list(t).Counters; c["wa"]["routed"] < 9 || c["wb"]["routed"] < 15 {
		t.Errorf("routed counters: wa %v, wb %v", c["wa"], c["wb"])
	}
	hosts := pb.in.MustRun("ports", "hosts", "--domain", "ports.test")
	for _, want := range []string{"198.19.200.1\twa.ports.test", "198.19.200.2\twb.ports.test", "2001:db8:200::2\twb.ports.test"} {
		if !strings.Contains(hosts, want) {
			t.Errorf("ports hosts:\n%s\nwant a line %q", hosts, want)
		}
	}
}
