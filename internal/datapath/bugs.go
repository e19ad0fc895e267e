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
	case sockbugs.EpollWakeup:
		return bypassSlKernelBugSL_BUG_EPOLL_NO_WAKEUP
	case sockbugs.FINLost:
		return bypassSlKernelBugSL_BUG_FIN_LOST
	case sockbugs.Uncharged:
		return bypassSlKernelBugSL_BUG_REDIRECT_UNCHARGED
	}
	return 0
}

// setBugs keeps the sockmap bugs detected (when a datapath is created),
// or why none could be.
func (f *Features) setBugs(r sockbugs.Report, err error) {
	if err != nil {
		f.BugsError = err.Error()
		return
	}
	for _, b := range r.Bugs {
		if b.Present {
			f.Bugs = append(f.Bugs, b)
		}
	}
}

// recordBugs records the bugs found in sl_kernel, for those that adopt the
// datapath later.
func (d *Datapath) recordBugs() {
	if d.features.BugsError != "" {
		return
	}
	var bits bypassSlKernelBug
	for _, b := range d.features.Bugs {
		bits |= bugBit(b.Name)
	}
	if err := d.objs.SlKernel.Update(uint32(0), bits, ebpf.UpdateAny); err != nil {
		d.features.BugsError = fmt.Sprintf("recording the kernel's bugs: %v", err)
	}
}

// Has reports whether the named sockmap bug was found on this kernel.
func (f Features) Has(bug string) bool {
	for _, b := range f.Bugs {
		if b.Name == bug {
			return true
		}
	}
	return false
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

// Decided says which of s follow from the bugs found here: what --bypass
// auto and --blocking-sockets auto chose (or would have), and how to ask
// otherwise.
func (f Features) Decided(s Settings) []string {
	var out []string
	for _, b := range []string{sockbugs.EpollWakeup, sockbugs.FINLost} {
		if !s.Bypass.On() && f.Has(b) {
			out = append(out, "bypass off: "+b+" found ("+sockbugs.Describe(b).Effect+"); --bypass on bypasses anyway")
		}
	}
	if !s.Bypass.On() && f.Has(sockbugs.FIONREAD) {
		out = append(out, "bypass off: this kernel's FIONREAD answers 0 for redirected bytes (fionread_zero), which hangs programs that size their reads by it (nginx); --bypass on bypasses anyway, on a kernel with "+sockbugs.Describe(sockbugs.FIONREAD).Fix+" it is on")
	}
	if !s.Bypass.On() && !f.PsockMsgTotLen {
		out = append(out, "bypass off: this kernel's sk_psock does not count queued bytes, so a slower reader gets no backpressure (its sender's writes fail with ENOMEM once TCP memory is under pressure); --bypass on bypasses anyway")
	}
	if why := f.ValveUnfit(); !s.BacklogValve.On() && why != "" && f.PsockMsgTotLen {
		out = append(out, "a direction whose reader falls behind moves to TCP for good (the backlog rule): the valve, which would push its writer back through TCP instead, cannot run on this kernel: "+why)
	}
	switch {
	case s.BypassBlocking == ModeProcess && f.Has(sockbugs.BlockingEAGAIN):
		out = append(out, "connections with a blocking reader whose process handles a signal that can interrupt its read stay on TCP: this kernel answers such a read with EAGAIN (blocking_read_eagain); other blocking readers are bypassed; --blocking-sockets bypass bypasses them all, tcp none")
	case s.BypassBlocking == ModeOff && f.Has(sockbugs.BlockingEAGAIN):
		out = append(out, "connections with a blocking reader stay on TCP (--blocking-sockets tcp): this kernel answers a blocking read interrupted by a signal with EAGAIN (blocking_read_eagain); per-process bypasses those whose process handles no such signal")
	}
	return out
}
