package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Attachment is the sl_sockops program attached to one cgroup.
type Attachment struct {
	CgroupID uint64 `json:"cgroup_id"`
	Path     string `json:"cgroup_path,omitempty"`
	LinkID   uint32 `json:"link_id"`
	// SeededListeners counts the listeners found listening already when
	// the cgroup was attached.
	SeededListeners int `json:"seeded_listeners,omitempty"`
}

func (d *Datapath) linkPin(h string, cgroupID uint64) string {
	return filepath.Join(d.cfg.PinDir, linkPin(h, cgroupID))
}

func linkPin(h string, cgroupID uint64) string {
	return linkPinPrefix + h + "_" + strconv.FormatUint(cgroupID, 10)
}

// Attach attaches the datapath's programs (service load balancer hooks and
// sl_sockops) to the cgroup at path (a cgroup v2 directory) with pinned
// links, which the kernel treats as multi attachments: other programs on
// that cgroup or its children keep running. Attaching twice to the same
// cgroup is a no-op. On failure nothing of this call stays attached.
func (d *Datapath) Attach(path string, cgroupID uint64) (*Attachment, error) {
	a := &Attachment{CgroupID: cgroupID, Path: path}
	var made []string
	for _, h := range hooks {
		pin := d.linkPin(h.name, cgroupID)
		if l, err := link.LoadPinnedLink(pin, nil); err == nil {
			if info, err := l.Info(); err == nil && h.name == hookSockops {
				a.LinkID = uint32(info.ID)
			}
			l.Close()
			continue
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: path, Attach: h.attach, Program: h.prog(d)})
		if err == nil {
			if err = l.Pin(pin); err == nil && h.name == hookSockops {
				if info, ierr := l.Info(); ierr == nil {
					a.LinkID = uint32(info.ID)
				}
			}
			l.Close()
		}
		if err != nil {
			for _, p := range made {
				_, _ = detachPin(p)
			}
			return nil, fmt.Errorf("attaching %s to %s: %w", h.name, path, err)
		}
		made = append(made, pin)
	}
	if len(made) > 0 {
		// The cgroup may hold servers that connections were learned
		// to find none of: learn again.
		if err := d.forgetDests(); err != nil {
			return nil, err
		}
		// And servers listening already: record their listeners. Best
		// effort: a listener missed keeps its first connections on TCP
		// (the safe side) until it is learned from one.
		a.SeededListeners, _ = d.seedListeners(path)
	}
	return a, nil
}

// forgetDests empties what the datapath learned of destinations.
func (d *Datapath) forgetDests() error {
	var keys []bypassSlDest
	if err := d.eachDest(func(k bypassSlDest, _ bypassSlDestStat) { keys = append(keys, k) }); err != nil {
		return err
	}
	for _, k := range keys {
		if err := d.objs.SlBrief.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("forgetting learned destinations: %w", err)
		}
	}
	return nil
}

// Detach removes this datapath's attachments from one cgroup. Only
// socklane's own links are touched. Returns false if there were none.
func (d *Datapath) Detach(cgroupID uint64) (bool, error) {
	any := false
	names := []string{legacyPolHook}
	for _, h := range hooks {
		names = append(names, h.name)
	}
	for _, n := range names {
		ok, err := detachPin(d.linkPin(n, cgroupID))
		if err != nil {
			return any, err
		}
		any = any || ok
	}
	return any, nil
}

func detachPin(pin string) (bool, error) {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("loading pinned link %s: %w", pin, err)
	}
	defer l.Close()
	if err := l.Unpin(); err != nil {
		return false, fmt.Errorf("unpinning %s: %w", pin, err)
	}
	return true, nil
}

// Attachments lists the cgroups this datapath is attached to.
func (d *Datapath) Attachments() ([]Attachment, error) { return Pins(d.cfg.PinDir).Attachments() }

// DetachAll removes every attachment of this datapath: no new connection
// joins the bypass; live ones keep it.
func (d *Datapath) DetachAll() (int, error) { return Pins(d.cfg.PinDir).DetachAll() }

// Sockets counts the sockets currently in the socket maps.
func (d *Datapath) Sockets() (int, error) { return Pins(d.cfg.PinDir).Sockets() }

// SocketsByMap counts the sockets currently in each socket map.
func (d *Datapath) SocketsByMap() (SocketCounts, error) { return Pins(d.cfg.PinDir).SocketsByMap() }

// Remove unpins every object of the datapath; see Pins.Remove.
func (d *Datapath) Remove() error { return Pins(d.cfg.PinDir).Remove() }
