package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/testbed"
	"github.com/socklane/socklane/internal/testutil"
)

// TestOwnerQuotas: one pod tries to fill each node-wide table; it is held
// to its quota (counted, and named by status), and another pod's bypass,
// blocking prediction, stale-socket destruction and affinity are as they
// were.
func TestOwnerQuotas(t *testing.T) {
	// The default quotas on the host; in -test.short (the emulated
	// kernels of the matrix, where thousands of sockets take minutes)
	// smaller ones, loaded as an operator would, and smaller attacks.
	var settings []string
	over := 800
	if testing.Short() {
		settings = []string{"--owner-conns", "256", "--owner-listeners", "128", "--owner-lb-conns", "256"}
		over = 100
	}
	quotas := func(in *testutil.Instance) datapath.Quotas {
		t.Helper()
		st := readStatus(t, in)
		if q := st.Settings.Quotas(); q.Conns != 0 {
			return q
		}
		t.Fatalf("status shows no quotas: %+v", st.Settings)
		return datapath.Quotas{}
	}
	t.Run("connection slots", func(t *testing.T) {
		b := testutil.Bed(t)
		in := testutil.NewInstance(t)
		in.Settings = append(in.Settings, settings...)
		att, cli, srv := testutil.Pod(t, b, "attacker"), testutil.Pod(t, b, "client"), testutil.Pod(t, b, "server")
		in.Attach(att, cli, srv)
		q := quotas(in)
		start(t, att, in.Bin, "peer", "sink", "0.0.0.0:7400")
		waitPort(t, att, "0.0.0.0:7400")
		before := in.Counters()
		n := int(q.Conns) + over
		hold, _ := backgroundIn(t, att, fmt.Sprintf("open %d", n), in.Bin, "peer", "open", "--ports", "7400", "--count", fmt.Sprint(n), att.IPv4.String())
		d := testutil.Delta(before, in.Counters())
		mustAtLeast(t, d, "fallback_quota", uint64(over))
		o := ownerOf(t, in, att)
		if o == nil || o.Conns != q.Conns || o.RefusedConns < uint64(over) || !strings.HasSuffix(o.Path, filepath.Base(att.Cgroup)) {
			t.Fatalf("status names the attacker %+v, want it holding %d slots, refused >= %d, cgroup %s", o, q.Conns, over, att.Cgroup)
		}
		victimBypassed(t, in, cli, srv, 7401)
		// The attacker's slots come back as its connections close.
		stop(hold)
		waitFor(t, func() bool { o := ownerOf(t, in, att); return o != nil && o.Conns == 0 })
	})

	t.Run("connections closed but for their files", func(t *testing.T) {
		// A connection its peer closed while its answer is unread keeps
		// its slot until its file is closed (it is still in the socket
		// map under the slot's key: linger_start): the attacker holds
		// such connections, within its quota of slots, and another pod's
		// connections are bypassed as before. A small quota: the slots
		// are the same as the held connections' above.
		const quota, over = 32, 32
		b := testutil.Bed(t)
		in := testutil.NewInstance(t)
		in.Settings = append(in.Settings, "--owner-conns", fmt.Sprint(quota))
		att, cli, srv := testutil.Pod(t, b, "attacker"), testutil.Pod(t, b, "client"), testutil.Pod(t, b, "server")
		in.Attach(att, cli, srv)
		start(t, att, in.Bin, "peer", "echo", "0.0.0.0:7403")
		waitPort(t, att, "0.0.0.0:7403")
		before := in.Counters()
		hold, _ := backgroundIn(t, att, fmt.Sprintf("open %d", quota+over), in.Bin, "peer", "open", "--closed", "--ports", "7403", "--count", fmt.Sprint(quota+over), att.IPv4.String())
		d := testutil.Delta(before, in.Counters())
		mustEqual(t, d, "conns_bypassed", quota)
		mustEqual(t, d, "lingers", quota)
		mustAtLeast(t, d, "fallback_quota", over)
		if o := ownerOf(t, in, att); o == nil || o.Conns != quota {
			t.Fatalf("status names the attacker %+v, want it holding its %d slots with its connections closed", o, quota)
		}
		if n := readStatus(t, in).Sockets; n != quota {
			t.Errorf("%d sockets in the maps, want the attacker's %d closed ones", n, quota)
		}
		victimBypassed(t, in, cli, srv, 7404)
		// The slots come back, and the sockets leave the maps, as the
		// attacker's files close.
		stop(hold)
		waitFor(t, func() bool {
			o := ownerOf(t, in, att)
			return o != nil && o.Conns == 0 && readStatus(t, in).Sockets == 0
		})
	})

	t.Run("listeners", func(t *testing.T) {
		b := testutil.Bed(t)
		in := testutil.NewInstance(t)
		in.Settings = append(in.Settings, settings...)
		att, cli, srv := testutil.Pod(t, b, "attacker"), testutil.Pod(t, b, "client"), testutil.Pod(t, b, "server")
		in.Attach(att, cli, srv)
		q := quotas(in)
		// The victim's server reads in blocking mode.
		start(t, srv, in.Bin, "peer", "echo", "--io", "blocking", "0.0.0.0:7402")
		waitPort(t, srv, "0.0.0.0:7402")
		before := in.Counters()
		// More listeners than the whole table held before (an LRU of
		// 16,384 that evicted the victim's), or in -test.short past the
		// smaller quota.
		listeners := uint64(18000)
		if testing.Short() {
			listeners = q.Listeners + uint64(over)
		}
		backgroundIn(t, att, fmt.Sprintf("listening %d", listeners), in.Bin, "peer", "listen", "--ports", fmt.Sprintf("20000-%d", 20000+listeners-1), "0.0.0.0")
		d := testutil.Delta(before, in.Counters())
		mustAtLeast(t, d, "listener_quota", listeners-q.Listeners)
		if o := ownerOf(t, in, att); o == nil || o.Listeners != q.Listeners || o.RefusedListeners < listeners-q.Listeners {
			t.Fatalf("status names the attacker %+v, want it holding %d listeners", o, q.Listeners)
		}
		// The victim's blocking server is still predicted blocking: its
		// connection stays on TCP and every byte arrives.
		before = in.Counters()
		runIn(t, cli, in.Bin, "peer", "pingpong", srv.IPv4.String()+":7402", "--count", "200", "--warmup", "0")
		d = testutil.Delta(before, in.Counters())
		mustEqual(t, d, "fallback_blocking", 1)
		mustEqual(t, d, "conns_bypassed", 0)
	})

	t.Run("translated sockets and affinity", func(t *testing.T) {
		// A small affinity quota: each of the attacker's namespaces
		// costs it one entry.
		const affinityQuota = 16
		lb := newLBBed(t, append(settings, "--owner-affinity", fmt.Sprint(affinityQuota))...)
		q := quotas(lb.in)
		be0, be1 := lb.back[0], lb.back[1]
		lb.apply(t, fmt.Sprintf(`services:
  - name: who
    vips: [198.19.0.10]
    ports:
      - {name: tcp, port: 80, protocol: TCP, targetPort: 8080}
      - {name: udp, port: 53, protocol: UDP, targetPort: 8080}
    backends: [{ip: %[1]s}, {ip: %[2]s}]
  - name: sticky
    vips: [198.19.0.11]
    ports: [{port: 80, targetPort: 8080}]
    sessionAffinity: ClientIP
    backends: [{ip: %[1]s}, {ip: %[2]s}]
`, be0.IPv4, be1.IPv4))
		// The attacker (the host-network pod) holds more connected UDP
		// sockets to the VIP than its quota.
		before := lb.lbCounters(t)
		n := int(q.LBConns) + over
		startHold(t, lb.in, lb.host, n, "--mode", "udp", "198.19.0.10:53")
		mustAtLeast(t, testutil.Delta(before, lb.lbCounters(t)), "quota", uint64(over))
		if o := ownerOf(t, lb.in, lb.host); o == nil || o.LBConns != q.LBConns || o.RefusedLBConns < uint64(over) {
			t.Fatalf("status names the attacker %+v, want it holding %d translated sockets", o, q.LBConns)
		}
		// The victim's sockets are still recorded: removing a backend
		// destroys those on it.
		h := startHold(t, lb.in, lb.client, 12, "--mode", "tcp", "198.19.0.10:80")
		on0 := h.on("be0")
		lb.apply(t, fmt.Sprintf("services:\n  - name: who\n    vips: [198.19.0.10]\n    ports: [{name: tcp, port: 80, protocol: TCP, targetPort: 8080}]\n    backends: [{ip: %s}]\n", be1.IPv4))
		closed := h.closed(t, len(on0), 0)
		for _, i := range on0 {
			if closed[i] != "ECONNABORTED" {
				t.Errorf("victim socket %d on the removed backend: %q, want ECONNABORTED", i, closed[i])
			}
		}

		// Affinity is per client network namespace, charged to the
		// cgroup that made it: a pod making network namespaces (the
		// host-network attacker) gets its quota of entries and no more,
		// and the victim's entry stays.
		lb.apply(t, fmt.Sprintf("services:\n  - name: sticky\n    vips: [198.19.0.11]\n    ports: [{port: 80, targetPort: 8080}]\n    sessionAffinity: ClientIP\n    backends: [{ip: %s}, {ip: %s}]\n", be0.IPv4, be1.IPv4))
		r := lb.probe(t, lb.client, "tcp", "198.19.0.11:80", 10)
		if len(r.Replies) != 1 {
			t.Fatalf("the victim's connections spread over %v with affinity", r.Replies)
		}
		before = lb.lbCounters(t)
		const namespaces = affinityQuota + 14
		for range namespaces {
			cmd, err := lb.host.Command("unshare", "-n", "sh", "-c", "ip link set lo up; exec "+lb.in.Bin+" peer lbprobe 198.19.0.11:80 --count 1")
			if err != nil {
				t.Fatal(err)
			}
			_ = cmd.Run() // the connect fails in an empty namespace; the pick happened
		}
		mustAtLeast(t, testutil.Delta(before, lb.lbCounters(t)), "affinity_quota", namespaces-affinityQuota)
		if o := ownerOf(t, lb.in, lb.host); o == nil || o.Affinity != affinityQuota || o.RefusedAffinity < namespaces-affinityQuota {
			t.Errorf("status names the attacker %+v, want it holding %d affinity entries, refused %d", o, affinityQuota, namespaces-affinityQuota)
		}
		if entries := lb.in.MapEntries("sl_svc_affinity"); entries != affinityQuota+1 {
			t.Errorf("sl_svc_affinity holds %d entries after %d namespaces of one pod connected, want its quota %d and the victim's", entries, namespaces, affinityQuota)
		}
		r2 := lb.probe(t, lb.client, "tcp", "198.19.0.11:80", 10)
		for be := range r.Replies {
			if r2.Replies[be] != 10 {
				t.Errorf("affinity changed: %v then %v", r.Replies, r2.Replies)
			}
		}
	})
}

// victimBypassed checks that a connection from cli to an echo in srv on
// port joins the bypass, refused nothing for a quota.
func victimBypassed(t *testing.T, in *testutil.Instance, cli, srv *testbed.Pod, port int) {
	t.Helper()
	listen := fmt.Sprintf("0.0.0.0:%d", port)
	start(t, srv, in.Bin, "peer", "echo", listen)
	waitPort(t, srv, listen)
	before := in.Counters()
	runIn(t, cli, in.Bin, "peer", "pingpong", fmt.Sprintf("%s:%d", srv.IPv4, port), "--count", "200", "--warmup", "0")
	d := testutil.Delta(before, in.Counters())
	mustEqual(t, d, "conns_bypassed", 1)
	mustEqual(t, d, "fallback_quota", 0)
}

// background starts name in pod p with its output in a locked buffer, and
// waits until the output says ready.
func backgroundIn(t *testing.T, p *testbed.Pod, ready string, name string, args ...string) (*exec.Cmd, *lockedBuffer) {
	t.Helper()
	cmd, err := p.Command(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	waitForLog(t, &out, func() bool { return strings.Contains(out.String(), ready) })
	return cmd, &out
}

func ownerOf(t *testing.T, in *testutil.Instance, p *testbed.Pod) *datapath.Owner {
	t.Helper()
	over, _ := owners(t, in)
	for i := range over {
		if over[i].Cgroup == p.CgroupID {
			return &over[i]
		}
	}
	return nil
}

// runIn runs a command in a pod and fails the test on error.
func runIn(t *testing.T, p *testbed.Pod, name string, args ...string) string {
	t.Helper()
	cmd, err := p.Command(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
	return string(out)
}
