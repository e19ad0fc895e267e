package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/peer"
	"github.com/socklane/socklane/internal/policy"
	"k8s.io/apimachinery/pkg/labels"
)

// Policies measures network policy: short connections and a stream
// between the two pods with N policies on the node (all selecting the
// server, the client's egress isolated too) against none, and the time
// to compile and program the N.
const Policies = "policies"

// Paths of the policies measurement.
const (
	PathNoPolicy = "no-policy"
	PathPolicies = "policies"
)

// MaxPolicies is the most policies the benchmark generates.
const MaxPolicies = 60000

// benchRemotePods are the cluster's other pods the policies name (as an
// API server lists them): in 198.18.201.0-198.18.204.255, outside every
// test bed's /24.
const benchRemotePods = 1000

// policySet is n policies over the client and server pods and
// benchRemotePods pods of 100 namespaces: two that let the client reach
// the server's ports, and n-2 more that also select the server, each
// letting in pods of one namespace and app on one port (every tenth an
// ipBlock with an exception too).
func policySet(n int, client, server *podRef, ports []uint16) *policy.Set {
	sel := func(kv ...string) labels.Selector {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return labels.SelectorFromSet(m)
	}
	s := &policy.Set{Namespaces: []policy.Namespace{{Name: "bench", Labels: map[string]string{"ns": "bench"}}}}
	for i := range 100 {
		s.Namespaces = append(s.Namespaces, policy.Namespace{Name: fmt.Sprintf("t-%d", i), Labels: map[string]string{"team": fmt.Sprintf("t-%d", i)}})
	}
	s.Pods = append(s.Pods,
		&policy.Pod{Namespace: "bench", Name: "client", Labels: map[string]string{"role": "client"}, IPs: []netip.Addr{client.ip}, CgroupID: client.cgroup},
		&policy.Pod{Namespace: "bench", Name: "server", Labels: map[string]string{"role": "server"}, IPs: []netip.Addr{server.ip}, CgroupID: server.cgroup})
	for j := range benchRemotePods {
		s.Pods = append(s.Pods, &policy.Pod{Namespace: fmt.Sprintf("t-%d", j%100), Name: fmt.Sprintf("r-%d", j),
			Labels: map[string]string{"app": fmt.Sprintf("a-%d", j%7)},
			IPs:    []netip.Addr{netip.AddrFrom4([4]byte{198, 18, byte(201 + j/250), byte(j%250 + 2)})}})
	}
	var allow []policy.Port
	for _, p := range ports {
		allow = append(allow, policy.Port{Protocol: policy.TCP, Port: p})
	}
	s.Policies = append(s.Policies,
		&policy.Policy{Namespace: "bench", Name: "server-from-client", Selector: sel("role", "server"), Isolates: [2]bool{true, false},
			Rules: [2][]policy.Rule{{{Peers: []policy.Peer{{Pods: sel("role", "client")}}, Ports: allow}}}},
		&policy.Policy{Namespace: "bench", Name: "client-to-server", Selector: sel("role", "client"), Isolates: [2]bool{false, true},
			Rules: [2][]policy.Rule{1: {{Peers: []policy.Peer{{Pods: sel("role", "server")}}}}}})
	for i := range max(n-2, 0) {
		peers := []policy.Peer{{Namespaces: sel("team", fmt.Sprintf("t-%d", i%100)), Pods: sel("app", fmt.Sprintf("a-%d", i%7))}}
		if i%10 == 0 {
			net := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(201 + i%4), 0}), 24)
			peers = append(peers, policy.Peer{Block: &policy.Block{CIDR: net,
				Except: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(201 + i%4), byte(i % 16 * 16)}), 28)}}})
		}
		s.Policies = append(s.Policies, &policy.Policy{Namespace: "bench", Name: fmt.Sprintf("filler-%d", i), Selector: sel("role", "server"),
			Isolates: [2]bool{true, false},
			Rules:    [2][]policy.Rule{{{Peers: peers, Ports: []policy.Port{{Protocol: policy.TCP, Port: uint16(10000 + i%5000)}}}}}})
	}
	return s
}

type podRef struct {
	ip     netip.Addr
	cgroup uint64
}

// checkPolicies validates the policies measurement's options.
func checkPolicies(o Options) error {
	if len(o.PolicyCounts) == 0 {
		return errors.New("--policy-counts: give at least one number of policies")
	}
	for _, n := range o.PolicyCounts {
		if n < 2 || n > MaxPolicies {
			return fmt.Errorf("--policy-counts %d: want 2 to %d", n, MaxPolicies)
		}
	}
	return nil
}

// measurePolicies runs short connections and a stream from the client to
// the server, both attached, with N policies programmed or none, and
// checks from the datapath's counters that the policies judged every
// connection (and nothing judged without them).
func (r *runner) measurePolicies(c *Case, path string) (Sample, error) {
	var s Sample
	if _, err := r.dp.Attach(r.client.Cgroup, r.client.CgroupID); err != nil {
		return s, err
	}
	if _, err := r.dp.Attach(r.server.Cgroup, r.server.CgroupID); err != nil {
		return s, err
	}
	defer func() { _, _ = r.dp.DetachAll() }()
	echo := r.addrPort(c)
	sink := echo + 1
	if path == PathPolicies {
		start := time.Now()
		set := policySet(c.Size, &podRef{r.client.IPv4, r.client.CgroupID}, &podRef{r.server.IPv4, r.server.CgroupID}, []uint16{echo, sink})
		t, err := policy.Compile(set, nil)
		if err != nil {
			return s, err
		}
		compiled := time.Since(start)
		st, err := r.dp.ApplyPolicies(t, nil)
		if err != nil {
			return s, err
		}
		// To enforcement: compiled and written, not the emptying of the
		// previous bank that follows.
		s.ProgramMs = float64((compiled + st.Took).Microseconds()) / 1000
		defer func() {
			if t, err := policy.Compile(&policy.Set{}, nil); err == nil {
				_, _ = r.dp.ApplyPolicies(t, nil)
			}
		}()
	}
	before, err := r.dp.ServiceStats()
	if err != nil {
		return s, err
	}
	if err := r.connects(c, netip.AddrPortFrom(r.server.IPv4, echo).String(), &s); err != nil {
		return s, err
	}
	mid, err := r.dp.ServiceStats()
	if err != nil {
		return s, err
	}
	judged := mid.Counters.Since(before.Counters).Get(datapath.LBCounterPolFirstPacket)
	switch {
	case path == PathPolicies && judged < uint64(r.o.Connects):
		return s, fmt.Errorf("%d SYNs judged for %d connections under %d policies", judged, r.o.Connects, c.Size)
	case path == PathNoPolicy && judged != 0:
		return s, fmt.Errorf("%d SYNs judged with no policy", judged)
	}
	// Established traffic: a stream, judged at its SYN only.
	out, err := r.run(r.client, r.clientCPU(c), r.self, "peer", "stream", netip.AddrPortFrom(r.server.IPv4, sink).String(),
		"--size", "16384", "--count", "0", "--duration", r.o.Duration.String(), "--io", string(r.o.IO))
	if err != nil {
		return s, err
	}
	var tp peer.Throughput
	if err := json.Unmarshal(out, &tp); err != nil {
		return s, fmt.Errorf("parsing %q: %w", out, err)
	}
	s.MBps, s.MsgRate = tp.MBps, tp.MsgRate
	after, err := r.dp.ServiceStats()
	if err != nil {
		return s, err
	}
	if n := after.Counters.Since(mid.Counters).Get(datapath.LBCounterPolFirstPacket); n > 1 {
		return s, fmt.Errorf("%d packets of one stream judged: want its SYN only", n)
	}
	return s, nil
}
