package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// LayoutVersion is the pinned layout this socklane creates and adopts.
const LayoutVersion = uint32(bypassSlLayoutVersionSL_LAYOUT_VERSION)

// recordLayout writes LayoutVersion into a datapath being created.
func (d *Datapath) recordLayout() error {
	if err := d.objs.SlLayout.Update(uint32(0), LayoutVersion, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("recording the layout version: %w", err)
	}
	return nil
}

// checkLayout refuses pins of another layout before anything of them is
// adopted: their programs keep running with their own layout, which this
// socklane's writes would corrupt.
func checkLayout(dir string) error {
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, bypassMapSlLayout), &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("the datapath pinned at %s was made by an older socklane (no layout version); this one uses layout %d: %w", dir, LayoutVersion, ErrIncompatible)
	}
	if err != nil {
		return fmt.Errorf("reading the layout version pinned at %s: %w", dir, err)
	}
	defer m.Close()
	var v uint32
	if err := m.Lookup(uint32(0), &v); err != nil {
		return fmt.Errorf("reading the layout version pinned at %s: %w", dir, err)
	}
	if v != LayoutVersion {
		return fmt.Errorf("the datapath pinned at %s has layout %d; this socklane uses layout %d: %w", dir, v, LayoutVersion, ErrIncompatible)
	}
	return nil
}
