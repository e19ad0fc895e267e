package sockdiag

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Namespaces returns one path for each network namespace that a process
// (/proc/PID/ns/net) or a bind mount (/run/netns) holds on this node.
func Namespaces() ([]string, error) {
	seen := map[[2]uint64]bool{}
	var out []string
	add := func(p string) {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return // the process exited meanwhile, or not a namespace
		}
		k := [2]uint64{st.Dev, st.Ino}
		if !seen[k] {
			seen[k] = true
			out = append(out, p)
		}
	}
	add("/proc/self/ns/net")
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	for _, e := range procs {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			add(filepath.Join("/proc", e.Name(), "ns", "net"))
		}
	}
	if mounts, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range mounts {
			add(filepath.Join("/run/netns", e.Name()))
		}
	}
	return out, nil
}

// Target is a socket to destroy, by cookie, in the network namespace with
// cookie Netns.
type Target struct {
	Cookie   uint64
	Netns    uint64
	Protocol uint8 // IPPROTO_TCP or IPPROTO_UDP
}

// DestroyAll destroys the target sockets wherever they are on this node
// and returns how many it destroyed. Targets already closed are skipped
// without error.
func DestroyAll(targets []Target) (int, error) {
	if len(targets) == 0 {
		return 0, nil
	}
	byNetns := map[uint64]map[uint64]uint8{}
	for _, t := range targets {
		if byNetns[t.Netns] == nil {
			byNetns[t.Netns] = map[uint64]uint8{}
		}
		byNetns[t.Netns][t.Cookie] = t.Protocol
	}
	paths, err := Namespaces()
	if err != nil {
		return 0, err
	}
	destroyed := 0
	var errs []error
	for _, p := range paths {
		if len(byNetns) == 0 {
			break
		}
		n, err := destroyIn(p, byNetns)
		destroyed += n
		if err != nil {
			if errors.Is(err, ErrNoDestroy) {
				return destroyed, err
			}
			errs = append(errs, err)
		}
	}
	return destroyed, errors.Join(errs...)
}

// destroyIn destroys the wanted sockets of the namespace at path, if its
// cookie is one of byNetns's, and forgets that namespace.
func destroyIn(path string, byNetns map[uint64]map[uint64]uint8) (int, error) {
	c, err := OpenIn(path)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOENT) {
		return 0, nil // the process is gone, and its namespace with it or elsewhere
	}
	if err != nil {
		return 0, err
	}
	defer c.Close()
	nc, err := c.NetnsCookie()
	if err != nil {
		return 0, err
	}
	want := byNetns[nc]
	if want == nil {
		return 0, nil
	}
	delete(byNetns, nc)
	protos := map[uint8]bool{}
	for _, p := range want {
		protos[p] = true
	}
	var victims []Socket
	for proto := range protos {
		for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
			socks, err := c.Dump(family, proto)
			if err != nil {
				return 0, err
			}
			for _, s := range socks {
				if p, ok := want[s.ID.Cookie]; ok && p == proto {
					victims = append(victims, s)
				}
			}
		}
	}
	n := 0
	for _, s := range victims {
		err := c.Destroy(s)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}
