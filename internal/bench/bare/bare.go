// Package bare is the bench's reference path: the bare sockmap redirect
// (bare.c) that socklane's bypass is measured against, loaded and
// attached by the bench to its own pods only.
package bare

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Path is the loaded reference datapath: its programs, its SOCKHASH
// with the sk_msg program (and the stream verdict, if asked for)
// attached, and the cgroups it is attached to.
type Path struct {
	objs  bareObjects
	maps  []link.RawAttachProgramOptions // the programs attached to the map
	links []link.Link
}

// Options are how the reference is loaded.
type Options struct {
	// StreamVerdict also attaches a pass-through sk_skb stream verdict to
	// the map, as socklane's valve does: the sockets then read through the
	// kernel's parser receive path, as socklane's do under the valve.
	StreamVerdict bool
}

// Load loads the programs and attaches them to the map; nothing is
// attached to a cgroup yet.
func Load(o Options) (*Path, error) {
	p := &Path{}
	if err := loadBareObjects(&p.objs, nil); err != nil {
		return nil, fmt.Errorf("loading the bare redirect: %w", err)
	}
	attach := []link.RawAttachProgramOptions{{Target: p.objs.SlBareSocks.FD(), Program: p.objs.SlBareMsg, Attach: ebpf.AttachSkMsgVerdict}}
	if o.StreamVerdict {
		attach = append(attach, link.RawAttachProgramOptions{Target: p.objs.SlBareSocks.FD(), Program: p.objs.SlBareSkb, Attach: ebpf.AttachSkSKBStreamVerdict})
	}
	for _, a := range attach {
		if err := link.RawAttachProgram(a); err != nil {
			return nil, errors.Join(fmt.Errorf("attaching the bare redirect's %s program: %w", a.Attach, err), p.Close())
		}
		p.maps = append(p.maps, a)
	}
	return p, nil
}

// Attach attaches the sock_ops program to the cgroup at path (with the
// kernel's multi-attach: other programs there stay).
func (p *Path) Attach(path string) error {
	l, err := link.AttachCgroup(link.CgroupOptions{Path: path, Attach: ebpf.AttachCGroupSockOps, Program: p.objs.SlBareSockops})
	if err != nil {
		return fmt.Errorf("attaching the bare redirect to %s: %w", path, err)
	}
	p.links = append(p.links, l)
	return nil
}

// Detach detaches the sock_ops program from every cgroup it was attached
// to. Connections established meanwhile stay in the map (and
// redirected) until they close.
func (p *Path) Detach() error {
	var errs []error
	for _, l := range p.links {
		errs = append(errs, l.Close())
	}
	p.links = nil
	return errors.Join(errs...)
}

// Counts are the sends redirected and those that found no peer, the
// sockets put in the map and refused by it, and the TCP segments the
// stream verdict passed.
type Counts struct{ Redirected, Missed, Joined, JoinFailed, SkbPassed uint64 }

// Counts reads the counters, summed over CPUs.
func (p *Path) Counts() (Counts, error) {
	var c Counts
	for key, dst := range map[bareSlBareCounter]*uint64{
		bareSlBareCounterSL_BARE_REDIRECTED:  &c.Redirected,
		bareSlBareCounterSL_BARE_MISSED:      &c.Missed,
		bareSlBareCounterSL_BARE_JOINED:      &c.Joined,
		bareSlBareCounterSL_BARE_JOIN_FAILED: &c.JoinFailed,
		bareSlBareCounterSL_BARE_SKB_PASSED:  &c.SkbPassed,
	} {
		var per []uint64
		if err := p.objs.SlBareCounts.Lookup(uint32(key), &per); err != nil {
			return c, fmt.Errorf("reading the bare redirect's counters: %w", err)
		}
		for _, n := range per {
			*dst += n
		}
	}
	return c, nil
}

// Programs are the reference's programs (for their run-time statistics).
func (p *Path) Programs() []*ebpf.Program {
	progs := []*ebpf.Program{p.objs.SlBareSockops}
	for _, a := range p.maps {
		progs = append(progs, a.Program)
	}
	return progs
}

// Close detaches and unloads everything.
func (p *Path) Close() error {
	errs := []error{p.Detach()}
	for _, a := range p.maps {
		errs = append(errs, link.RawDetachProgram(link.RawDetachProgramOptions(a)))
	}
	p.maps = nil
	return errors.Join(append(errs, p.objs.Close())...)
}
