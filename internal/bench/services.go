package bench

import (
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/peer"
	"github.com/socklane/socklane/internal/service"
	"github.com/socklane/socklane/internal/testbed"
)

// Services compares service load balancing at connect() with kube-proxy's
// iptables mode, for N services: short connections from a pod to one
// service, and the time to program N services.
const Services = "services"

// Paths of the services measurement.
const (
	PathIptables = "iptables"    // kube-proxy-style NAT rules, datapath detached
	PathSockLB   = "socklane-lb" // socklane's connect-time load balancer, bypass off
	// PathDirect: no service, the client connects to a backend's own
	// address. The floor any connect-time load balancer can reach, so
	// iptables / direct is the highest rate ratio any of them can show.
	PathDirect = "direct"
)

// MaxServices is the most services the benchmark generates (one VIP each
// in 198.19.0.0/16).
const MaxServices = 65000

// servicePort is the port every benchmark service listens on.
const servicePort = 80

// svcVIP is the virtual IP of service i.
func svcVIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{198, 19, byte((i + 1) >> 8), byte(i + 1)})
}

// targetService is the service the client connects to: the middle one,
// so that iptables walks half of its rules, its average.
func targetService(n int) int { return n / 2 }

// serviceSet is n services of two backends each on port targetPort.
func serviceSet(n int, backends []netip.Addr, targetPort uint16) (*service.Set, error) {
	var b strings.Builder
	b.WriteString("services:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - name: svc-%d\n    vips: [%s]\n    ports: [{port: %d, targetPort: %d}]\n    backends:\n", i, svcVIP(i), servicePort, targetPort)
		for _, a := range backends {
			fmt.Fprintf(&b, "      - {ip: %s}\n", a)
		}
	}
	return service.Parse([]byte(b.String()))
}

// chainName is kube-proxy's naming: a prefix and 16 base32 characters of
// a hash of what the chain stands for.
func chainName(prefix, of string) string {
	h := sha256.Sum256([]byte(of))
	return prefix + base32.StdEncoding.EncodeToString(h[:])[:16]
}

// kubeProxyRules writes the nat table kube-proxy's iptables mode would
// program for n services of the given backends: KUBE-SERVICES with one
// rule per service port, a KUBE-SVC chain per service choosing an
// endpoint with statistic random, a KUBE-SEP chain per endpoint with the
// hairpin mark and the DNAT. The chains hang off OUTPUT (the client pod's
// own namespace), which spares the baseline the routing through the node
// that kube-proxy's PREROUTING path adds: a conservative baseline.
func kubeProxyRules(n int, backends []netip.Addr, targetPort uint16) string {
	var b strings.Builder
	b.WriteString("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n")
	type sep struct{ chain, ip string }
	svcs := make([]string, n)
	seps := make([][]sep, n)
	for i := range n {
		name := fmt.Sprintf("default/svc-%d:http", i)
		svcs[i] = chainName("KUBE-SVC-", name)
		fmt.Fprintf(&b, ":%s - [0:0]\n", svcs[i])
		for _, a := range backends {
			s := sep{chainName("KUBE-SEP-", name+a.String()), a.String()}
			seps[i] = append(seps[i], s)
			fmt.Fprintf(&b, ":%s - [0:0]\n", s.chain)
		}
	}
	b.WriteString("-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
	b.WriteString("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n")
	for i := range n {
		fmt.Fprintf(&b, "-A KUBE-SERVICES -d %s/32 -p tcp -m comment --comment \"default/svc-%d:http cluster IP\" -m tcp --dport %d -j %s\n",
			svcVIP(i), i, servicePort, svcs[i])
	}
	for i := range n {
		for j, s := range seps[i] {
			if left := len(seps[i]) - j; left > 1 {
				fmt.Fprintf(&b, "-A %s -m comment --comment \"default/svc-%d:http -> %s:%d\" -m statistic --mode random --probability %.11f -j %s\n",
					svcs[i], i, s.ip, targetPort, 1/float64(left), s.chain)
			} else {
				fmt.Fprintf(&b, "-A %s -m comment --comment \"default/svc-%d:http -> %s:%d\" -j %s\n", svcs[i], i, s.ip, targetPort, s.chain)
			}
			fmt.Fprintf(&b, "-A %s -s %s/32 -j KUBE-MARK-MASQ\n", s.chain, s.ip)
			fmt.Fprintf(&b, "-A %s -p tcp -m tcp -j DNAT --to-destination %s:%d\n", s.chain, s.ip, targetPort)
		}
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// checkServices finds what the services measurement needs.
func checkServices(o Options) error {
	if len(o.ServiceCounts) == 0 {
		return errors.New("--service-counts: give at least one number of services")
	}
	for _, n := range o.ServiceCounts {
		if n < 1 || n > MaxServices {
			return fmt.Errorf("--service-counts %d: want 1 to %d", n, MaxServices)
		}
	}
	if o.IptablesMaxServices < 0 {
		return fmt.Errorf("--iptables-max-services %d: want 0 or more", o.IptablesMaxServices)
	}
	for _, cmd := range []string{"iptables-restore", "iptables", "nft"} {
		if _, err := exec.LookPath(cmd); err != nil {
			return fmt.Errorf("the services measurement compares with kube-proxy's iptables rules: %s not found (apt-get install iptables nftables)", cmd)
		}
	}
	return nil
}

// serviceBackends gives the server pod a second address, so that every
// service has two endpoints as in the kube-proxy rules.
func serviceBackends(server *testbed.Pod) ([]netip.Addr, error) {
	a4 := server.IPv4.As4()
	alias := netip.AddrFrom4([4]byte{a4[0], a4[1], a4[2], 250})
	cmd, err := server.Command("ip", "addr", "add", alias.String()+"/24", "dev", "eth0")
	if err != nil {
		return nil, err
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("adding a second server address: %w: %s", err, out)
	}
	return []netip.Addr{server.IPv4, alias}, nil
}

// inPod runs a command in pod, with stdin, and returns how long it took.
func inPod(pod *testbed.Pod, stdin string, name string, args ...string) (time.Duration, error) {
	cmd, err := pod.Command(name, args...)
	if err != nil {
		return 0, err
	}
	cmd.Stdin = strings.NewReader(stdin)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err != nil {
		return took, fmt.Errorf("%s %v: %w: %s", name, args, err, out)
	}
	return took, nil
}

// removeNatTable deletes the client pod's nat table, not only its rules:
// with the table gone the namespace stops tracking connections, so the
// socklane runs that follow do not pay for conntrack the iptables runs
// needed.
func (r *runner) removeNatTable() {
	if _, err := inPod(r.client, "", "nft", "delete", "table", "ip", "nat"); err == nil {
		return
	}
	// iptables-legacy: the table stays registered; empty it at least.
	r.o.Log.Warn("could not delete the client pod's nat table (iptables-legacy?): later socklane runs still pass conntrack")
	_, _ = inPod(r.client, "", "iptables", "-t", "nat", "-F")
	_, _ = inPod(r.client, "", "iptables", "-t", "nat", "-X")
}

// measureServices programs N services one way, connects to one of them
// r.o.Connects times, and removes them again.
func (r *runner) measureServices(c *Case, path string) (Sample, error) {
	n := c.Size
	port := r.addrPort(c)
	target := netip.AddrPortFrom(svcVIP(targetService(n)), servicePort)
	var s Sample
	if _, err := r.dp.DetachAll(); err != nil {
		return s, err
	}
	switch path {
	case PathIptables:
		took, err := inPod(r.client, kubeProxyRules(n, r.backends, port), "iptables-restore", "--noflush")
		if err != nil {
			return s, fmt.Errorf("programming %d services with iptables-restore: %w", n, err)
		}
		s.ProgramMs = float64(took.Microseconds()) / 1000
		defer r.removeNatTable()
	case PathSockLB:
		// Only the client is attached: its connects are balanced, and
		// with the server outside socklane nothing is bypassed.
		if _, err := r.dp.Attach(r.client.Cgroup, r.client.CgroupID); err != nil {
			return s, err
		}
		set, err := serviceSet(n, r.backends, port)
		if err != nil {
			return s, err
		}
		st, err := r.dp.ApplyServices(set)
		if err != nil {
			return s, err
		}
		s.ProgramMs = float64(st.Took.Microseconds()) / 1000
		defer func() { _, _ = r.dp.ApplyServices(&service.Set{}) }()
	case PathDirect:
		target = netip.AddrPortFrom(r.backends[0], port)
	}
	lbBefore, err := r.dp.ServiceStats()
	if err != nil {
		return s, err
	}
	before, err := r.dp.Counters()
	if err != nil {
		return s, err
	}
	if err := r.connects(c, target.String(), &s); err != nil {
		return s, err
	}
	lbAfter, err := r.dp.ServiceStats()
	if err != nil {
		return s, err
	}
	after, err := r.dp.Counters()
	if err != nil {
		return s, err
	}
	selected := lbAfter.Counters.Since(lbBefore.Counters).Get(datapath.LBCounterSelected)
	s.Redirected = after.Since(before).Get(datapath.CounterRedirectMsgs)
	switch {
	case s.Redirected != 0:
		return s, fmt.Errorf("%d messages were bypassed in a load balancing run", s.Redirected)
	case path == PathSockLB && selected < uint64(r.o.Connects):
		return s, fmt.Errorf("socklane chose a backend %d times for %d connections", selected, r.o.Connects)
	case path != PathSockLB && selected != 0:
		return s, fmt.Errorf("socklane chose backends %d times with its load balancer detached", selected)
	}
	return s, nil
}

// connects runs r.o.Connects short connections (connect, 64 B request and
// answer, close) from the client to target and records their latency.
func (r *runner) connects(c *Case, target string, s *Sample) error {
	var l peer.Latency
	if err := r.runJSON(r.client, c, &l, r.self, "peer", "connects", target, "--size", "64", "--count", strconv.Itoa(r.o.Connects), "--io", string(r.o.IO)); err != nil {
		return err
	}
	s.setLatency(l)
	return nil
}
