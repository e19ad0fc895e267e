package datapath

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Pins is a pinned datapath seen only through its bpffs directory, without
// loading its programs: what removal needs, so that a datapath pinned by
// another socklane version (whose maps this build cannot adopt) can still be
// detached, drained and removed.
type Pins string

// links lists the datapath's pinned links: cgroup id -> hook -> pin path.
func (p Pins) links() (map[uint64]map[string]string, error) { return p.linksUnder(linkPinPrefix) }

// linksUnder lists the links pinned as <prefix><hook>_<cgroup id>:
// cgroup id -> hook -> pin path.
func (p Pins) linksUnder(prefix string) (map[uint64]map[string]string, error) {
	entries, err := os.ReadDir(string(p))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", string(p), err)
	}
	out := map[uint64]map[string]string{}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok {
			continue
		}
		i := strings.LastIndexByte(rest, '_')
		if i < 0 {
			continue
		}
		id, err := strconv.ParseUint(rest[i+1:], 10, 64)
		if err != nil {
			continue
		}
		if out[id] == nil {
			out[id] = map[string]string{}
		}
		out[id][rest[:i]] = filepath.Join(string(p), e.Name())
	}
	return out, nil
}

// Attachments lists the cgroups the datapath is attached to, in cgroup id
// order; LinkID is the sock_ops link's.
func (p Pins) Attachments() ([]Attachment, error) {
	ls, err := p.links()
	if err != nil {
		return nil, err
	}
	var out []Attachment
	for id, hs := range ls {
		a := Attachment{CgroupID: id}
		if pin, ok := hs[hookSockops]; ok {
			if l, err := link.LoadPinnedLink(pin, nil); err == nil {
				if info, err := l.Info(); err == nil {
					a.LinkID = uint32(info.ID)
				}
				l.Close()
			}
		}
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b Attachment) int { return cmp.Compare(a.CgroupID, b.CgroupID) })
	return out, nil
}

// DetachAll removes every attachment: no new connection joins the bypass
// or is load-balanced; live ones keep what they have. Returns the number of
// cgroups detached.
func (p Pins) DetachAll() (int, error) {
	for _, prefix := range []string{portLinkPrefix, polLinkPrefix} {
		if err := p.detachPrefix(prefix); err != nil {
			return 0, err
		}
	}
	ls, err := p.links()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, hs := range ls {
		for _, pin := range hs {
			if _, err := detachPin(pin); err != nil {
				return n, err
			}
		}
		n++
	}
	return n, nil
}

// SocketCounts are the sockets in each socket map.
type SocketCounts struct {
	// Valve: in sl_sockmap, whose sk_skb verdict the valve needs (their
	// reads take the kernel's parser receive path).
	Valve int `json:"valve"`
	// Plain: in sl_sockmap_plain (every connection under --reader-verdict
	// late, or where the datapath runs without the valve).
	Plain int `json:"plain"`
	// Late: those of Plain given the valve's verdict late, in
	// sl_sockmap_late as well (--reader-verdict late).
	Late int `json:"late"`
}

// Total is the number of bypassed sockets.
func (s SocketCounts) Total() int { return s.Valve + s.Plain }

// Sockets counts the sockets currently in the socket maps (the valve's
// and the plain one).
func (p Pins) Sockets() (int, error) {
	s, err := p.SocketsByMap()
	return s.Total(), err
}

// SocketsByMap counts the sockets currently in each socket map (those
// given the verdict late are in two).
func (p Pins) SocketsByMap() (SocketCounts, error) {
	var s SocketCounts
	ids, err := p.socketIDsUsed()
	if err != nil {
		return s, err
	}
	if s.Valve, err = countPinnedSockets(filepath.Join(string(p), bypassMapSlSockmap), ids); err != nil {
		return s, err
	}
	if s.Plain, err = countPinnedSockets(filepath.Join(string(p), bypassMapSlSockmapPlain), ids); err != nil {
		return s, err
	}
	s.Late, err = countPinnedSockets(filepath.Join(string(p), bypassMapSlSockmapLate), ids)
	return s, err
}

// socketIDsUsed bounds the socket ids (slot << 1 | role) a socket can be
// under: those of the slots ever taken, which are taken fresh and in order
// (sl_conn_next) before any is reused.
func (p Pins) socketIDsUsed() (uint32, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(string(p), bypassMapSlConnNext), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return 0, fmt.Errorf("opening the pinned connection slot counter: %w", err)
	}
	defer m.Close()
	var next uint64
	if err := m.Lookup(uint32(0), &next); err != nil {
		return 0, fmt.Errorf("reading the connection slot counter: %w", err)
	}
	return uint32(min(next, uint64(math.MaxUint32/2)) * 2), nil
}

// countPinnedSockets counts the sockets of the socket map pinned at path
// (an array indexed by socket id) under its first ids ids.
func countPinnedSockets(path string, ids uint32) (int, error) {
	m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return 0, fmt.Errorf("opening pinned socket map %s: %w", filepath.Base(path), err)
	}
	defer m.Close()
	n := 0
	var cookie uint64
	for id := range min(ids, m.MaxEntries()) {
		err := m.Lookup(id, &cookie)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("looking up socket id %d in socket map %s: %w", id, filepath.Base(path), err)
		}
		n++
	}
	return n, nil
}

// Remove detaches and unpins socklane's objects, then the directory unless
// another program pinned something in it. Live bypassed sockets lose the
// bypass when the last handle goes: bytes they had queued but not yet read
// are dropped by the kernel. Callers drain first unless forced.
func (p Pins) Remove() error {
	if _, err := p.DetachAll(); err != nil {
		return err
	}
	return removeOwn(string(p))
}

// PruneDefunct removes the attachments of cgroups that no longer exist (a
// pod that went away): the kernel detached their links when the cgroup
// was released, which leaves their pins behind. Returns the cgroup ids
// pruned.
func (p Pins) PruneDefunct() ([]uint64, error) {
	ls, err := p.links()
	if err != nil {
		return nil, err
	}
	var gone []uint64
	for id, hs := range ls {
		pin, ok := hs[hookSockops]
		if !ok {
			continue
		}
		l, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			continue
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			continue
		}
		if cg := info.Cgroup(); cg == nil || cg.CgroupId != 0 {
			continue
		}
		for _, pin := range hs {
			if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
				return gone, fmt.Errorf("removing %s: %w", pin, err)
			}
		}
		gone = append(gone, id)
	}
	slices.Sort(gone)
	return gone, nil
}
