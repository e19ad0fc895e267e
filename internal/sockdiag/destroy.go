package sockdiag

import (
	"errors"
	"fmt"
	"net/netip"
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
	destroyed := 0
	err := visit(targets, func(c *Conn, found []Socket) error {
		n, err := c.destroyEach(found)
		destroyed += n
		return err
	})
	return destroyed, err
}

// destroyEach destroys socks and returns how many it destroyed; sockets
// already gone are skipped.
func (c *Conn) destroyEach(socks []Socket) (int, error) {
	destroyed := 0
	for _, s := range socks {
		err := c.Destroy(s)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return destroyed, err
		}
		destroyed++
	}
	return destroyed, nil
}

// Owned returns the cookies of the target sockets that an owner still
// holds open somewhere on this node. A socket its owner closed may linger
// in the kernel (FIN_WAIT, TIME_WAIT keeps the cookie) but has no inode
// any more: it is not counted. A socket is found only in a network
// namespace that a process or a /run/netns mount holds.
func Owned(targets []Target) (map[uint64]bool, error) {
	out := map[uint64]bool{}
	err := visit(targets, func(_ *Conn, found []Socket) error {
		for _, s := range found {
			if s.Inode != 0 {
				out[s.ID.Cookie] = true
			}
		}
		return nil
	})
	return out, err
}

// visit calls fn, in each network namespace holding targets, with the
// target sockets found open there.
func visit(targets []Target, fn func(*Conn, []Socket) error) error {
	if len(targets) == 0 {
		return nil
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
		return err
	}
	var errs []error
	for _, p := range paths {
		if len(byNetns) == 0 {
			break
		}
		if err := visitIn(p, byNetns, fn); err != nil {
			if errors.Is(err, ErrNoDestroy) {
				return err
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// visitIn finds the wanted sockets of the namespace at path, if its cookie
// is one of byNetns's, hands them to fn, and forgets that namespace.
func visitIn(path string, byNetns map[uint64]map[uint64]uint8, fn func(*Conn, []Socket) error) error {
	c, err := OpenIn(path)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOENT) {
		return nil // the process is gone, and its namespace with it or elsewhere
	}
	if err != nil {
		return err
	}
	defer c.Close()
	nc, err := c.NetnsCookie()
	if err != nil {
		return err
	}
	want := byNetns[nc]
	if want == nil {
		return nil
	}
	delete(byNetns, nc)
	protos := map[uint8]bool{}
	for _, p := range want {
		protos[p] = true
	}
	var found []Socket
	for proto := range protos {
		for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
			socks, err := c.Dump(family, proto)
			if err != nil {
				return err
			}
			for _, s := range socks {
				if p, ok := want[s.ID.Cookie]; ok && p == proto {
					found = append(found, s)
				}
			}
		}
	}
	return fn(c, found)
}

// TCPTimeWait is TIME_WAIT in the kernel's TCP state numbering.
const TCPTimeWait = 6

// DestroyTimeWait removes the TCP TIME_WAIT sockets of the connection's
// network namespace whose remote address match accepts, and returns how
// many it removed. A client making many short connections to one address
// leaves one per connection for a minute, and each new connect() then
// searches past them for a free port: clearing them gives every run of a
// benchmark the same start.
func (c *Conn) DestroyTimeWait(match func(netip.AddrPort) bool) (int, error) {
	removed := 0
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		socks, err := c.Dump(family, unix.IPPROTO_TCP)
		if err != nil {
			return removed, err
		}
		var tw []Socket
		for _, s := range socks {
			if s.State == TCPTimeWait && match(s.Remote()) {
				tw = append(tw, s)
			}
		}
		n, err := c.destroyEach(tw)
		removed += n
		if err != nil {
			return removed, err
		}
	}
	return removed, nil
}

// TCP states (the kernel's numbering) that Connections reads.
const (
	TCPEstablished = 1
	TCPListen      = 10
	tcpClose       = 7
)

// Connected is a connected socket of one network namespace, with whether
// it was accepted (its local port has a listener there: it is the server
// end).
type Connected struct {
	Socket
	Accepted bool
}

// DestroyConnected visits every network namespace of the node, offers
// each connected TCP and UDP socket to judge, and destroys those it
// returns true for. It returns how many it destroyed.
func DestroyConnected(judge func(Connected) bool) (int, error) {
	paths, err := Namespaces()
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, p := range paths {
		c, err := OpenIn(p)
		if err != nil {
			continue // the namespace went away
		}
		var doomed []Socket
		for _, proto := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
			for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
				socks, err := c.Dump(fam, proto)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				listening := map[uint16]bool{}
				for _, s := range socks {
					if proto == unix.IPPROTO_TCP && s.State == TCPListen {
						listening[s.ID.SrcPort] = true
					}
				}
				for _, s := range socks {
					if s.ID.DstPort == 0 || (proto == unix.IPPROTO_TCP && (s.State == TCPListen || s.State == TCPTimeWait || s.State == tcpClose)) {
						continue
					}
					if judge(Connected{Socket: s, Accepted: proto == unix.IPPROTO_TCP && listening[s.ID.SrcPort]}) {
						doomed = append(doomed, s)
					}
				}
			}
		}
		d, err := c.destroyEach(doomed)
		n += d
		if err != nil {
			errs = append(errs, err)
		}
		c.Close()
	}
	return n, errors.Join(errs...)
}
