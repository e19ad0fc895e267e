package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
)

// maxInstanceName bounds an instance name (a directory under the bpffs
// and under /run/socklane).
const maxInstanceName = 64

// CheckInstanceName accepts a name that is one path element of letters,
// digits, '.', '_' and '-', starting with a letter or digit: the instance's
// directories are derived from it, and removing an instance removes them.
func CheckInstanceName(name string) error {
	bad := name == "" || len(name) > maxInstanceName || !isAlnum(name[0])
	for i := 0; i < len(name) && !bad; i++ {
		c := name[i]
		bad = !isAlnum(c) && c != '.' && c != '_' && c != '-'
	}
	if bad {
		return fmt.Errorf("--name %q: an instance name is 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit (the default is socklane)", name, maxInstanceName)
	}
	return nil
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// ErrNotPinned is returned by Pins.Remove when there is no datapath.
var ErrNotPinned = errors.New("no socklane datapath pinned")

// ErrIncompatible wraps a refusal to adopt pins this socklane cannot use
// as they are (another layout, an older version, damaged maps): only
// removing them (draining first) and loading again helps.
var ErrIncompatible = errors.New("the pinned datapath is not one this socklane can adopt")

// ownPins is what socklane pins in an instance directory: its programs
// (prog_ and the program's name), its maps (named sl_*), and its links.
func ownPins() (map[string]bool, error) {
	own := map[string]bool{}
	b, err := loadBypass()
	if err != nil {
		return nil, fmt.Errorf("loading embedded BPF object: %w", err)
	}
	l, err := loadServicelb()
	if err != nil {
		return nil, fmt.Errorf("loading embedded BPF object: %w", err)
	}
	pt, err := loadPorts()
	if err != nil {
		return nil, fmt.Errorf("loading embedded BPF object: %w", err)
	}
	for _, spec := range []*ebpf.CollectionSpec{b, l, pt} {
		for _, m := range spec.Maps {
			if strings.HasPrefix(m.Name, "sl_") {
				own[m.Name] = true
			}
		}
		for _, p := range spec.Programs {
			own[progPinPrefix+p.Name] = true
		}
	}
	return own, nil
}

// pinNames is what dir holds now (nil if it does not exist).
func pinNames(dir string) (map[string]bool, error) {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("reading %s: %w", dir, err)
	}
	names := map[string]bool{}
	for _, e := range entries {
		names[e.Name()] = true
	}
	return names, nil
}

// unpinNew removes socklane's pins in dir that are not in before: what a
// creation that failed part way had pinned (the loader pins each map as it
// creates it, and a later map or program may be refused). Anything dir
// held before stays.
func unpinNew(dir string, before map[string]bool) error {
	own, err := ownPins()
	if err != nil {
		return err
	}
	now, err := pinNames(dir)
	if err != nil {
		return err
	}
	for n := range now {
		if own[n] && !before[n] {
			if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("unpinning %s: %w", filepath.Join(dir, n), err)
			}
		}
	}
	return nil
}

// removeOwn unpins socklane's objects from dir and removes dir if nothing
// else is left in it. Whatever another program pinned there stays, and is
// named in the error.
func removeOwn(dir string) error {
	own, err := ownPins()
	if err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w at %s", ErrNotPinned, dir)
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", dir, err)
	}
	var foreign []string
	for _, e := range entries {
		n := e.Name()
		link := (strings.HasPrefix(n, linkPinPrefix) || strings.HasPrefix(n, portLinkPrefix) || strings.HasPrefix(n, polLinkPrefix)) && !e.IsDir()
		if !own[n] && !link {
			foreign = append(foreign, n)
			continue
		}
		if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("unpinning %s: %w", filepath.Join(dir, n), err)
		}
	}
	if len(foreign) > 0 {
		slices.Sort(foreign)
		return fmt.Errorf("socklane's pins are removed from %s, but the directory is left in place: it holds objects socklane did not pin (%s); remove them yourself if they are not in use", dir, strings.Join(foreign, ", "))
	}
	if err := os.Remove(dir); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	return nil
}
