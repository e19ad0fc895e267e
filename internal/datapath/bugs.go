package datapath

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/sockbugs"
)

// bugBit is a probed bug's bit in sl_kernel.
func bugBit(name string) bypassSlKernelBug {
	switch name {
	case sockbugs.FIONREAD:
		return bypassSlKernelBugSL_BUG_FIONREAD_ZERO
	case sockbugs.Peek:
		return bypassSlKernelBugSL_BUG_MSG_PEEK
	case sockbugs.Splice:
		return bypassSlKernelBugSL_BUG_SPLICE_BLIND
	case sockbugs.BlockingEAGAIN:
		return bypassSlKernelBugSL_BUG_BLOCKING_READ_EAGAIN
	}
	return 0
}

// detectBugs probes the kernel's sockmap bugs (when the datapath is
// created) and records them in sl_kernel. A probe that cannot run records
// nothing and is reported.
func (d *Datapath) detectBugs() {
	r, err := sockbugs.Detect()
	if err != nil {
		d.features.BugsError = err.Error()
		return
	}
	var bits bypassSlKernelBug
	for _, b := range r.Bugs {
		if b.Present {
			bits |= bugBit(b.Name)
			d.features.Bugs = append(d.features.Bugs, b)
		}
	}
	if err := d.objs.SlKernel.Update(uint32(0), bits, ebpf.UpdateAny); err != nil {
		d.features.BugsError = fmt.Sprintf("recording the kernel's bugs: %v", err)
	}
}

// readBugs reads what the datapath's creator detected.
func (d *Datapath) readBugs() {
	var bits bypassSlKernelBug
	if err := d.objs.SlKernel.Lookup(uint32(0), &bits); err != nil {
		d.features.BugsError = fmt.Sprintf("reading the kernel's bugs: %v", err)
		return
	}
	for _, name := range sockbugs.Names() {
		if bits&bugBit(name) != 0 {
			d.features.Bugs = append(d.features.Bugs, sockbugs.Describe(name))
		}
	}
}
