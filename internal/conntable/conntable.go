// Package conntable filters and sorts the datapath's connection table for
// `socklane conns`: by pod (network namespace), port and address.
package conntable

import (
	"bufio"
	"cmp"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/socklane/socklane/internal/cgroups"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/sockdiag"
)

// Filter selects connections; zero fields select everything.
type Filter struct {
	// Netns: connections with an end in one of these network namespaces
	// (cookies, as the datapath records them).
	Netns map[uint64]bool
	Port  uint16     // either end's port
	Addr  netip.Addr // either end's address
	// All keeps connections that are pending or stayed on TCP; otherwise
	// only bypassed ones are kept.
	All bool
}

// Match tells whether c passes the filter.
func (f Filter) Match(c datapath.Conn) bool {
	if !f.All && c.State != "bypass" {
		return false
	}
	if f.Netns != nil && !f.Netns[c.NetNS] && !f.Netns[c.ServerNetNS] {
		return false
	}
	if f.Port != 0 && c.Client.Port() != f.Port && c.Server.Port() != f.Port {
		return false
	}
	if f.Addr.IsValid() && c.Client.Addr() != f.Addr && c.Server.Addr() != f.Addr {
		return false
	}
	return true
}

// Apply filters conns in place.
func (f Filter) Apply(conns []datapath.Conn) []datapath.Conn {
	return slices.DeleteFunc(conns, func(c datapath.Conn) bool { return !f.Match(c) })
}

// SortKeys are the orders `conns --sort` knows.
func SortKeys() []string { return []string{"age", "bytes", "client", "server"} }

func total(c datapath.Conn) uint64 {
	return c.ClientToServer.Bytes + c.ClientToServer.TCPBytes + c.ServerToClient.Bytes + c.ServerToClient.TCPBytes
}

// Sort orders conns: age (oldest first), bytes (most first), client or
// server address.
func Sort(conns []datapath.Conn, key string) error {
	var f func(a, b datapath.Conn) int
	switch key {
	case "age":
		f = func(a, b datapath.Conn) int { return cmp.Compare(b.Age, a.Age) }
	case "bytes":
		f = func(a, b datapath.Conn) int { return cmp.Compare(total(b), total(a)) }
	case "client":
		f = func(a, b datapath.Conn) int { return a.Client.Compare(b.Client) }
	case "server":
		f = func(a, b datapath.Conn) int { return a.Server.Compare(b.Server) }
	default:
		return fmt.Errorf("--sort %q: want one of %v", key, SortKeys())
	}
	slices.SortStableFunc(conns, f)
	return nil
}

// NetnsOfPID is the network namespace cookie of a process.
func NetnsOfPID(pid int) (uint64, error) {
	c, err := sockdiag.OpenIn(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return 0, fmt.Errorf("process %d: %w", pid, err)
	}
	defer c.Close()
	return c.NetnsCookie()
}

// NetnsOfCgroup returns the network namespaces of the processes in a
// cgroup v2 directory and below it (a pod's cgroup holds its containers).
func NetnsOfCgroup(dir string) (map[uint64]bool, error) {
	out := map[uint64]bool{}
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		f, err := os.Open(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			return nil // not a cgroup directory, or gone meanwhile
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			pid, err := strconv.Atoi(strings.TrimSpace(sc.Text()))
			if err != nil {
				continue
			}
			if ns, err := NetnsOfPID(pid); err == nil {
				out[ns] = true
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading cgroup %s: %w", dir, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("cgroup %s has no process: it has no network namespace to filter by", dir)
	}
	return out, nil
}

// Netns resolves a pod given as a process (pid) or a cgroup directory
// (absolute, or relative to the cgroup v2 root) to its network
// namespaces; nil if neither is given.
func Netns(pid int, cgroup string) (map[uint64]bool, error) {
	switch {
	case pid != 0 && cgroup != "":
		return nil, fmt.Errorf("give --pid or --cgroup, not both")
	case pid != 0:
		ns, err := NetnsOfPID(pid)
		if err != nil {
			return nil, fmt.Errorf("--pid %d: %w", pid, err)
		}
		return map[uint64]bool{ns: true}, nil
	case cgroup != "":
		root, err := cgroups.Root()
		if err != nil {
			return nil, err
		}
		path, _, err := cgroups.Resolve(root, cgroup)
		if err != nil {
			return nil, err
		}
		return NetnsOfCgroup(path)
	}
	return nil, nil
}
