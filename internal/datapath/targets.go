package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf/link"
)

// Hooks attached to a chosen set of cgroups (targets) rather than to the
// datapath's attachments: the port virtualization hooks (portLinkPrefix)
// and the policy's packet hook (polLinkPrefix). Their links are pinned as
// <prefix><hook>_<cgroup id>, so that the set is read back from the pins.

func (d *Datapath) targetPin(prefix, h string, cgroupID uint64) string {
	return filepath.Join(d.cfg.PinDir, prefix+h+"_"+strconv.FormatUint(cgroupID, 10))
}

// attachTargets attaches hs to every cgroup of want (id -> path) that
// does not have them yet, leaving out the hooks skip names (detached
// where they are). It returns the pins it made. On a failure every pin
// made by this call is detached again and the error returned.
func (d *Datapath) attachTargets(prefix string, hs []hook, want map[uint64]string, skip func(hook) bool) ([]string, error) {
	var made []string
	for id, path := range want {
		for _, h := range hs {
			pin := d.targetPin(prefix, h.name, id)
			if skip != nil && skip(h) {
				if _, err := detachPin(pin); err != nil {
					detachPins(made)
					return nil, err
				}
				continue
			}
			if _, err := os.Stat(pin); err == nil {
				continue
			}
			if err := attachPinned(pin, path, h, d); err != nil {
				detachPins(made)
				return nil, err
			}
			made = append(made, pin)
		}
	}
	return made, nil
}

// attachPinned attaches h to the cgroup at path and pins its link at pin.
// A pin another process made meanwhile is taken as this attach (the link
// made here is closed, which detaches it).
func attachPinned(pin, path string, h hook, d *Datapath) error {
	l, err := link.AttachCgroup(link.CgroupOptions{Path: path, Attach: h.attach, Program: h.prog(d)})
	if err != nil {
		return fmt.Errorf("attaching %s to %s: %w", h.name, path, err)
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		if _, serr := os.Stat(pin); serr == nil {
			return nil
		}
		return fmt.Errorf("pinning %s's link to %s: %w", h.name, path, err)
	}
	return nil
}

// detachTargetsBut detaches hs from every target cgroup of prefix not in
// keep.
func (d *Datapath) detachTargetsBut(prefix string, hs []hook, keep map[uint64]string) error {
	have, err := Pins(d.cfg.PinDir).targets(prefix)
	if err != nil {
		return err
	}
	for _, id := range have {
		if _, ok := keep[id]; ok {
			continue
		}
		for _, h := range hs {
			if _, err := detachPin(d.targetPin(prefix, h.name, id)); err != nil {
				return err
			}
		}
	}
	return nil
}

func detachPins(pins []string) {
	for _, p := range pins {
		_, _ = detachPin(p)
	}
}

// targets lists the cgroup ids with links pinned under prefix.
func (p Pins) targets(prefix string) ([]uint64, error) {
	ls, err := p.linksUnder(prefix)
	if err != nil {
		return nil, err
	}
	out := make([]uint64, 0, len(ls))
	for id := range ls {
		out = append(out, id)
	}
	return out, nil
}

// detachPrefix removes every link pinned under prefix.
func (p Pins) detachPrefix(prefix string) error {
	entries, err := os.ReadDir(string(p))
	if err != nil {
		return fmt.Errorf("reading %s: %w", string(p), err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			if _, err := detachPin(filepath.Join(string(p), e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}
