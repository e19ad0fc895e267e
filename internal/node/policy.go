package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/socklane/socklane/internal/cgroups"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/policy"
	"github.com/socklane/socklane/internal/sockdiag"
	"golang.org/x/sys/unix"
)

const policiesFile = "policies.json"

// PolicyResult is what an apply of network policy did.
type PolicyResult struct {
	datapath.PolicyStats
	// Destroyed counts established connections the new policy denies,
	// destroyed (both ends when both are on this node).
	Destroyed int           `json:"connections_destroyed"`
	Compile   time.Duration `json:"compile_ns"`
}

// ApplyPolicies programs the network policy with a validated set: this
// node's pods are found by their cgroups (paths relative to the cgroup v2
// mount, or absolute), this node's addresses are added as the host, the
// set is compiled and written, recorded for `policy list|get|test`, and
// the established connections it denies are destroyed. A pod whose cgroup
// does not exist fails the apply before anything changes.
func ApplyPolicies(dp *datapath.Datapath, name string, set *policy.Set, log *slog.Logger) (PolicyResult, error) {
	var res PolicyResult
	if err := resolveCgroups(set); err != nil {
		return res, err
	}
	host, err := hostAddrs()
	if err != nil {
		return res, err
	}
	set.Host = host
	dir, err := privateStateDir(name)
	if err != nil {
		return res, err
	}
	unlock, err := lockFile(filepath.Join(dir, "apply.lock"))
	if err != nil {
		return res, err
	}
	defer unlock()
	prev, err := readPolicyRecord(name)
	if err != nil {
		return res, err
	}
	var prevIDs map[string]uint32
	if prev != nil {
		prevIDs = prev.IDs
	}
	start := time.Now()
	tables, err := policy.Compile(set, prevIDs)
	if err != nil {
		return res, fmt.Errorf("compiling policies: %w", err)
	}
	res.Compile = time.Since(start)
	var freed []uint32
	for k, id := range prevIDs {
		if _, ok := tables.IDs[k]; !ok {
			freed = append(freed, id)
		}
	}
	if res.PolicyStats, err = dp.ApplyPolicies(tables, freed); err != nil {
		return res, fmt.Errorf("applying policies: %w", err)
	}
	if err := writeJSONFile(filepath.Join(dir, policiesFile), set.Record(tables.IDs)); err != nil {
		return res, fmt.Errorf("recording policies: %w", err)
	}
	res.Destroyed, err = DestroyDenied(set)
	if err != nil {
		// The policy applies to new connections; say what was missed.
		log.Warn("destroying connections the new policy denies", "err", err, "destroyed", res.Destroyed)
	}
	return res, nil
}

// DestroyDenied destroys the established TCP and connected UDP sockets
// of this node whose connection set denies, judged as a new one would be
// (client: the connecting end).
func DestroyDenied(set *policy.Set) (int, error) {
	return sockdiag.DestroyConnected(func(c sockdiag.Connected) bool {
		local, remote := c.Local(), c.Remote()
		client, server := local, remote
		if c.Accepted {
			client, server = remote, local
		}
		from, to := set.Endpoint(client.Addr().Unmap()), set.Endpoint(server.Addr().Unmap())
		if (from.Pod == nil || !from.Pod.Local()) && (to.Pod == nil || !to.Pod.Local()) {
			return false
		}
		proto := policy.TCP
		if c.Protocol == unix.IPPROTO_UDP {
			proto = policy.UDP
		}
		return !set.Decide(from, to, server.Port(), proto).Allowed
	})
}

// AppliedPolicies returns the set last applied to instance name with its
// policy ids (nil if none).
func AppliedPolicies(name string) (*policy.Set, map[string]uint32, error) {
	r, err := readPolicyRecord(name)
	if err != nil || r == nil {
		return nil, nil, err
	}
	s, err := r.Set()
	if err != nil {
		return nil, nil, err
	}
	return s, r.IDs, nil
}

// PolicyNames maps the applied policies' ids to namespace/name.
func PolicyNames(name string) (map[uint32]string, error) {
	r, err := readPolicyRecord(name)
	out := map[uint32]string{}
	if err != nil || r == nil {
		return out, err
	}
	for k, id := range r.IDs {
		out[id] = k
	}
	return out, nil
}

func readPolicyRecord(name string) (*policy.Record, error) {
	b, err := os.ReadFile(filepath.Join(StateDir(name), policiesFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading applied policies: %w", err)
	}
	var r policy.Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("reading applied policies: %w", err)
	}
	return &r, nil
}

// resolveCgroups finds the cgroup ids of the pods that name a cgroup.
func resolveCgroups(set *policy.Set) error {
	var root string
	for i, p := range set.Pods {
		if p.Cgroup == "" {
			continue
		}
		if root == "" {
			r, err := cgroups.Root()
			if err != nil {
				return err
			}
			root = r
		}
		_, id, err := cgroups.Resolve(root, p.Cgroup)
		if err != nil {
			return fmt.Errorf("pods[%d] (%s): cgroup %s: %w (give the pod's cgroup v2 directory, or leave cgroup out for a pod of another node)", i, p.Key(), p.Cgroup, err)
		}
		p.CgroupID = id
	}
	return nil
}

// hostAddrs are this node's own addresses (loopback aside).
func hostAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("listing this node's addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok || ip.Unmap().IsLoopback() || ip.IsLinkLocalUnicast() {
			continue
		}
		out = append(out, ip.Unmap())
	}
	return out, nil
}
