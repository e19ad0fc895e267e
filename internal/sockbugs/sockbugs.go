// Package sockbugs detects, by behaviour, the kernel's known sockmap bugs
// that decide what socklane may bypass: two loopback sockets in a private
// network namespace are put in a socket map of the probe's own, one
// redirects to the other's receive queue (as the datapath does), and the
// receiver is read the ways programs read. No version string is trusted.
package sockbugs

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Bug is one known sockmap bug, as detected on this kernel.
type Bug struct {
	Name    string `json:"name"`
	Present bool   `json:"present"`
	// What it breaks, and the upstream change that removes it.
	Effect string `json:"effect"`
	Fix    string `json:"fix"`
	// Seen is what the probe observed.
	Seen string `json:"seen"`
}

// Report is every bug probed.
type Report struct {
	Bugs []Bug `json:"bugs"`
}

// Has reports whether the named bug was detected.
func (r Report) Has(name string) bool {
	for _, b := range r.Bugs {
		if b.Name == name {
			return b.Present
		}
	}
	return false
}

// Names of the bugs probed.
const (
	FIONREAD        = "fionread_zero"
	Peek            = "msg_peek"
	Splice          = "splice_blind"
	BlockingEAGAIN  = "blocking_read_eagain"
	EpollWakeup     = "epoll_no_wakeup"
	FINLost         = "fin_lost"
	Uncharged       = "redirect_uncharged"
	probeMessage    = "socklane-probe"
	probeSignalWait = 200 * time.Millisecond
)

// Describe is what is known of a bug by name: its effect and its fix.
func Describe(name string) Bug {
	b := Bug{Name: name}
	switch name {
	case FIONREAD:
		b.Effect = "FIONREAD answers 0 for redirected bytes: programs that size their reads by it (nginx) wait forever"
		b.Fix = "929e30f93125 and b40cc5adaa80 (bpf, sockmap: FIONREAD for redirected bytes)"
	case Peek:
		b.Effect = "MSG_PEEK does not see redirected bytes"
		b.Fix = "da9e915eaf5d (bpf, sockmap: MSG_PEEK on ingress messages, 6.6)"
	case Splice:
		b.Effect = "splice(2) from the receiver never sees redirected bytes (Go's io.Copy between TCP connections, proxies): such a connection stalls"
		b.Fix = "tcp_bpf: splice_read for sockmap sockets (proposed upstream, not merged)"
	case EpollWakeup:
		b.Effect = "epoll is not woken for bytes redirected into a socket it waits on: event-driven servers stall until something else wakes them"
		b.Fix = "the 6.4 sockmap wake-up fixes (e5c6de5fa025, 6df7f764cd3c, ea444185a6bf)"
	case FINLost:
		b.Effect = "a FIN that follows redirected bytes is not seen: the reader waits instead of reading end of file"
		b.Fix = "901546fd8f9c (bpf, sockmap: handle FIN, 6.4)"
	case Uncharged:
		b.Effect = "bytes redirected into a socket are not charged to its receive memory (sk_rmem_alloc): TCP's window does not shrink for them, so the valve (--slow-readers valve) cannot hold a writer at its reader's buffer"
		b.Fix = "d888b7af7c14 (tcp_bpf: charge receive socket buffer in bpf_tcp_ingress(), 6.13, and stable series)"
	case BlockingEAGAIN:
		b.Effect = "a blocking read on a bypassed socket interrupted by a signal returns EAGAIN, which plain TCP never does (Go's runtime signals its threads): socklane keeps blocking sockets on TCP"
		b.Fix = "none merged"
	}
	return b
}

// Names lists every bug probed, in report order.
func Names() []string {
	return []string{FIONREAD, Peek, Splice, BlockingEAGAIN, EpollWakeup, FINLost, Uncharged}
}

// Detect runs every probe in a private network namespace, on a thread of
// its own; the caller's namespace never changes.
func Detect() (Report, error) { return detectIn(true) }

// detectIn runs the probes with the bytes redirected through a socket map,
// or (the probes' negative control) over plain TCP.
func detectIn(redirect bool) (Report, error) {
	var r Report
	err := InPrivateNetns(func() error {
		var err error
		r, err = detect(redirect)
		return err
	})
	return r, err
}

// InPrivateNetns runs fn on a thread of its own in a new network namespace
// whose loopback is up; the caller's namespace never changes. The thread
// is left locked, and so ended, afterwards: it is in another namespace.
func InPrivateNetns(fn func() error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- fmt.Errorf("making a private network namespace: %w", err)
			return
		}
		if err := loopbackUp(); err != nil {
			ch <- err
			return
		}
		ch <- fn()
	}()
	return <-ch
}

func detect(redirect bool) (Report, error) {
	var r Report
	// Each probe on a pair of its own, with bytes just redirected.
	probes := []struct {
		name string
		test func(p *pair) (bool, string, error)
	}{
		{FIONREAD, func(p *pair) (bool, string, error) {
			n, err := unix.IoctlGetInt(p.server, unix.SIOCINQ)
			return err == nil && n == 0, fmt.Sprintf("FIONREAD %d with %d bytes redirected (err %v)", n, len(probeMessage), err), nil
		}},
		{Peek, func(p *pair) (bool, string, error) {
			buf := make([]byte, 64)
			n, _, err := unix.Recvfrom(p.server, buf, unix.MSG_PEEK|unix.MSG_DONTWAIT)
			return n != len(probeMessage), fmt.Sprintf("peeked %d bytes (err %v)", n, err), nil
		}},
		{Splice, func(p *pair) (bool, string, error) {
			var pipe [2]int
			if err := unix.Pipe2(pipe[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
				return false, "", err
			}
			defer unix.Close(pipe[0])
			defer unix.Close(pipe[1])
			// Non-blocking, as Go's and event-driven proxies' sockets
			// are: a blocking one would wait here for ever.
			if err := unix.SetNonblock(p.server, true); err != nil {
				return false, "", err
			}
			n, err := unix.Splice(p.server, nil, pipe[1], nil, 64, unix.SPLICE_F_NONBLOCK)
			return n <= 0, fmt.Sprintf("spliced %d bytes (err %v)", n, err), nil
		}},
		{EpollWakeup, func(p *pair) (bool, string, error) {
			buf := make([]byte, 64)
			if _, err := unix.Read(p.server, buf); err != nil { // the probe message
				return false, "", err
			}
			return p.epollWakeup()
		}},
		{FINLost, func(p *pair) (bool, string, error) {
			if err := unix.Shutdown(p.client, unix.SHUT_WR); err != nil {
				return false, "", err
			}
			buf := make([]byte, 64)
			n, err := unix.Read(p.server, buf) // the probe message
			if err != nil {
				return false, "", err
			}
			// Then end of file, at once; a lost FIN leaves the read
			// waiting until SO_RCVTIMEO.
			m, err := unix.Read(p.server, buf)
			return m != 0 || err != nil, fmt.Sprintf("read %d bytes, then %d (err %v) after the peer's FIN", n, m, err), nil
		}},
		{BlockingEAGAIN, func(p *pair) (bool, string, error) {
			buf := make([]byte, 64)
			if _, err := unix.Read(p.server, buf); err != nil { // the probe message
				return false, "", err
			}
			return p.interruptedRead()
		}},
		{Uncharged, func(p *pair) (bool, string, error) {
			rmem, err := rmemAlloc(p.server)
			if err != nil {
				return false, "", err
			}
			return rmem < uint32(len(probeMessage)), fmt.Sprintf("the receiver's sk_rmem_alloc is %d with %d bytes redirected and not read", rmem, len(probeMessage)), nil
		}},
	}
	for _, pr := range probes {
		in := pairTCP
		if redirect {
			in = pairRedirect
		}
		p, err := newPair(in)
		if err != nil {
			return r, err
		}
		bug := Describe(pr.name)
		err = p.send()
		if err == nil {
			bug.Present, bug.Seen, err = pr.test(p)
		}
		p.close()
		if err != nil {
			return r, fmt.Errorf("probing %s: %w", pr.name, err)
		}
		r.Bugs = append(r.Bugs, bug)
	}
	return r, nil
}

// loopbackUp brings lo up in the current (private) namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("reading lo's flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing lo up: %w", err)
	}
	return nil
}

// pair is a client and a server socket over loopback, in a socket map
// whose sk_msg program redirects the client's sends into the server's
// receive queue (as its pairMode says).
type pair struct {
	client, server int
	m              *ebpf.Map
	prog           *ebpf.Program
}

// pairMode is where a pair's sockets are.
type pairMode int

const (
	// pairTCP: neither in a map (plain TCP).
	pairTCP pairMode = iota
	// pairRedirect: both in the map, the client's sends redirected.
	pairRedirect
	// pairServerInMap: only the server in the map (which has no stream
	// verdict), so the client's bytes reach it through TCP: a socket of
	// socklane's plain map whose peer sends through TCP.
	pairServerInMap
)

func newPair(mode pairMode) (*pair, error) {
	ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(ln)
	if err := unix.Bind(ln, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return nil, err
	}
	if err := unix.Listen(ln, 1); err != nil {
		return nil, err
	}
	sa, err := unix.Getsockname(ln)
	if err != nil {
		return nil, err
	}
	p := &pair{client: -1, server: -1}
	ok := false
	defer func() {
		if !ok {
			p.close()
		}
	}()
	if p.client, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
		return nil, err
	}
	if err := unix.Connect(p.client, sa); err != nil {
		return nil, err
	}
	if p.server, _, err = unix.Accept4(ln, unix.SOCK_CLOEXEC); err != nil {
		return nil, err
	}
	// No probe may hang: a blocking read gives up after 2 s.
	tv := unix.Timeval{Sec: 2}
	if err := unix.SetsockoptTimeval(p.server, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return nil, err
	}
	if mode == pairTCP {
		ok = true
		return p, nil
	}
	if p.m, err = ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.SockHash, KeySize: 4, ValueSize: 8, MaxEntries: 2}); err != nil {
		return nil, fmt.Errorf("creating a socket map: %w", err)
	}
	p.prog, err = ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.SkMsg,
		License: "GPL",
		Instructions: asm.Instructions{
			// r1 = msg (already); key 0 on the stack.
			asm.Mov.Imm(asm.R2, 0),
			asm.StoreMem(asm.RFP, -8, asm.R2, asm.Word),
			asm.LoadMapPtr(asm.R2, p.m.FD()),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, -8),
			asm.Mov.Imm(asm.R4, 1), // BPF_F_INGRESS
			asm.FnMsgRedirectHash.Call(),
			asm.Return(),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("loading the probe's sk_msg program: %w", err)
	}
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: p.m.FD(), Program: p.prog, Attach: ebpf.AttachSkMsgVerdict}); err != nil {
		return nil, fmt.Errorf("attaching the probe's sk_msg program: %w", err)
	}
	// After the program: a socket takes the map's programs when it joins.
	// Key 0: the server (the redirect target).
	members := []int{p.server, p.client}
	if mode == pairServerInMap {
		members = members[:1]
	}
	for key, fd := range members {
		if err := p.m.Update(uint32(key), uint64(fd), ebpf.UpdateAny); err != nil {
			return nil, fmt.Errorf("adding a socket to the map: %w", err)
		}
	}
	ok = true
	return p, nil
}

func (p *pair) send() error {
	n, err := unix.Write(p.client, []byte(probeMessage))
	if err != nil || n != len(probeMessage) {
		return fmt.Errorf("sending through the probe's socket map: %d bytes, %v", n, err)
	}
	// Redirects are synchronous; give a wake-up a moment anyway.
	time.Sleep(10 * time.Millisecond)
	return nil
}

// interruptedRead blocks in read on the (empty) server socket on a thread
// of its own, signals that thread, and reports whether the read returned
// EAGAIN.
func (p *pair) interruptedRead() (bool, string, error) {
	type result struct {
		n   int
		err error
	}
	tidCh := make(chan int, 1)
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tidCh <- unix.Gettid()
		buf := make([]byte, 64)
		n, err := unix.Read(p.server, buf)
		done <- result{n, err}
	}()
	tid := <-tidCh
	waitBlocked(tid, p.server, probeSignalWait)
	// SIGURG: the Go runtime's own preemption signal, with a handler
	// installed without SA_RESTART semantics mattering to a raw read.
	if err := unix.Tgkill(os.Getpid(), tid, syscall.SIGURG); err != nil {
		return false, "", err
	}
	select {
	case r := <-done:
		return errors.Is(r.err, unix.EAGAIN), fmt.Sprintf("read returned %d, %v after a signal", r.n, r.err), nil
	case <-time.After(probeSignalWait):
	}
	// Still blocked (the kernel restarted it): end it with a byte.
	_, _ = unix.Write(p.client, []byte{0})
	r := <-done
	return errors.Is(r.err, unix.EAGAIN), fmt.Sprintf("read kept blocking through a signal, then returned %d, %v", r.n, r.err), nil
}

// epollWakeup waits in epoll_wait on the (empty) server socket while the
// client sends, and reports whether the wait timed out.
func (p *pair) epollWakeup() (bool, string, error) { return p.epollWakeupFor(unix.EPOLLIN) }

// epollWakeupFor is epollWakeup waiting for events (EPOLLIN, with or
// without EPOLLET).
func (p *pair) epollWakeupFor(events uint32) (bool, string, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return false, "", err
	}
	defer unix.Close(ep)
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, p.server, &unix.EpollEvent{Events: events, Fd: int32(p.server)}); err != nil {
		return false, "", err
	}
	n, err := epollWaitWhile(ep, probeSignalWait/4, 10*probeSignalWait, func() error {
		_, err := unix.Write(p.client, []byte(probeMessage))
		return err
	})
	if n < 0 {
		return false, "", err
	}
	return n != 1 || err != nil, fmt.Sprintf("epoll_wait returned %d (err %v) for bytes sent while it waited", n, err), nil
}

// epollWaitWhile waits in epoll_wait on ep, on a thread of its own, for
// up to timeout; once that thread sleeps there (or settle passed), it
// calls send. It returns epoll_wait's count and error, or -1 and send's.
func epollWaitWhile(ep int, settle, timeout time.Duration, send func() error) (int, error) {
	type result struct {
		n   int
		err error
	}
	tidCh := make(chan int, 1)
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tidCh <- unix.Gettid()
		evs := make([]unix.EpollEvent, 1)
		for {
			n, err := unix.EpollWait(ep, evs, int(timeout/time.Millisecond))
			if errors.Is(err, unix.EINTR) {
				continue
			}
			done <- result{n, err}
			return
		}
	}()
	waitBlocked(<-tidCh, ep, settle)
	if err := send(); err != nil {
		<-done
		return -1, err
	}
	r := <-done
	return r.n, r.err
}

// rmemAlloc is fd's receive memory (SO_MEMINFO's sk_rmem_alloc).
func rmemAlloc(fd int) (uint32, error) {
	var info [unix.SK_MEMINFO_VARS]uint32
	size := uint32(unsafe.Sizeof(info))
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_MEMINFO,
		uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&size)), 0)
	if errno != 0 {
		return 0, fmt.Errorf("reading SO_MEMINFO: %w", errno)
	}
	return info[unix.SK_MEMINFO_RMEM_ALLOC], nil
}

func (p *pair) close() {
	for _, fd := range []int{p.client, p.server} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	if p.prog != nil {
		p.prog.Close()
	}
	if p.m != nil {
		p.m.Close()
	}
}
