package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

// Attachments lists the cgroups the datapath is attached to.
func (p Pins) Attachments() ([]Attachment, error) {
	entries, err := os.ReadDir(string(p))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", string(p), err)
	}
	var out []Attachment
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, linkPinPrefix) {
			continue
		}
		id, err := strconv.ParseUint(strings.TrimPrefix(name, linkPinPrefix), 10, 64)
		if err != nil {
			continue
		}
		a := Attachment{CgroupID: id}
		if l, err := link.LoadPinnedLink(filepath.Join(string(p), name), nil); err == nil {
			if info, err := l.Info(); err == nil {
				a.LinkID = uint32(info.ID)
			}
			l.Close()
		}
		out = append(out, a)
	}
	return out, nil
}

// DetachAll removes every attachment: no new connection joins the bypass;
// live ones keep it.
func (p Pins) DetachAll() (int, error) {
	as, err := p.Attachments()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, a := range as {
		ok, err := detachPin(filepath.Join(string(p), linkPinPrefix+strconv.FormatUint(a.CgroupID, 10)))
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	return n, nil
}

// sockhashName is the pin name of the socket map, taken from the object.
func sockhashName() (string, error) {
	spec, err := loadBypass()
	if err != nil {
		return "", fmt.Errorf("loading embedded BPF object: %w", err)
	}
	var specs bypassSpecs
	if err := spec.Assign(&specs); err != nil {
		return "", fmt.Errorf("reading embedded BPF object: %w", err)
	}
	return specs.SlSockhash.Name, nil
}

// Sockets counts the sockets currently in the socket map.
func (p Pins) Sockets() (int, error) {
	name, err := sockhashName()
	if err != nil {
		return 0, err
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(string(p), name), nil)
	if err != nil {
		return 0, fmt.Errorf("opening pinned socket map: %w", err)
	}
	defer m.Close()
	var key, next uint32
	n := 0
	k := any(nil)
	for n <= int(m.MaxEntries()) {
		err := m.NextKey(k, &next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return n, fmt.Errorf("iterating socket map: %w", err)
		}
		n++
		key = next
		k = &key
	}
	return n, nil
}

// Remove detaches and unpins everything. Live bypassed sockets lose the
// bypass when the last handle goes: bytes they had queued but not yet read
// are dropped by the kernel. Callers drain first unless forced.
func (p Pins) Remove() error {
	if _, err := p.DetachAll(); err != nil {
		return err
	}
	if err := os.RemoveAll(string(p)); err != nil {
		return fmt.Errorf("removing %s: %w", string(p), err)
	}
	return nil
}
