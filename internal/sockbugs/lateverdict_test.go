package sockbugs

import (
	"encoding/binary"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/socklane/socklane/internal/testutil"
)

// TestLateVerdict: can a socket that joined a socket map without a stream
// verdict (socklane's plain map, whose reads skip the kernel's parser
// receive path) be given one later, while it is established and holds
// redirected bytes nobody read? sock_ops may add a socket to a map only at
// its ESTABLISHED and LISTEN callbacks, and cgroup_skb not at all; a tc
// program run by BPF_PROG_TEST_RUN on a thread in the socket's network
// namespace can look it up by its tuple (bpf_sk_lookup_tcp) and add it to
// a second map that carries only a stream verdict. The test does that
// between sends and checks what the valve needs of the verdict: TCP's
// bytes queue behind the redirected ones already there and ahead of the
// ones redirected after, so none overtakes another. The control, without
// the late join, shows the overtaking the verdict prevents: bytes
// redirected after TCP's are read first. What FIONREAD counts is logged.
func TestLateVerdict(t *testing.T) {
	testutil.RequireRoot(t)
	for _, tt := range []struct {
		name    string
		upgrade bool
		want    string
	}{
		{"no verdict (control)", false, "red1red2tcp1"},
		{"verdict joined late", true, "red1tcp1red2"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := InPrivateNetns(func() error {
				lv, err := newLateVerdict()
				if err != nil {
					return err
				}
				defer lv.close()
				if err := lv.send(true, "red1"); err != nil {
					return err
				}
				if tt.upgrade {
					if err := lv.join(); err != nil {
						return err
					}
				}
				if err := lv.send(false, "tcp1"); err != nil {
					return err
				}
				if err := lv.send(true, "red2"); err != nil {
					return err
				}
				inq, _ := unix.IoctlGetInt(lv.p.server, unix.SIOCINQ)
				got, err := readN(lv.p.server, len(tt.want))
				if err != nil {
					return err
				}
				t.Logf("read %q; FIONREAD said %d before", got, inq)
				if got != tt.want {
					return fmt.Errorf("read %q, want %q", got, tt.want)
				}
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
}

// lateVerdict is a loopback pair in a map whose sk_msg program redirects
// the client's sends to the server while ctl holds 1 (else they go through
// TCP), and the pieces of a late join: a second map with a pass-through
// stream verdict, and a tc program that adds the socket tuple holds to it.
type lateVerdict struct {
	p                *pair
	a, b, ctl, tup   *ebpf.Map
	msg, skb, joiner *ebpf.Program
}

func newLateVerdict() (lv *lateVerdict, err error) {
	lv = &lateVerdict{}
	defer func() {
		if err != nil {
			lv.close()
		}
	}()
	if lv.p, err = newPair(pairTCP); err != nil {
		return nil, err
	}
	for _, m := range []struct {
		m    **ebpf.Map
		spec ebpf.MapSpec
	}{
		{&lv.a, ebpf.MapSpec{Type: ebpf.SockHash, KeySize: 4, ValueSize: 8, MaxEntries: 2}},
		{&lv.b, ebpf.MapSpec{Type: ebpf.SockHash, KeySize: 4, ValueSize: 8, MaxEntries: 2}},
		{&lv.ctl, ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1}},
		// struct bpf_sock_tuple's ipv4 member: addresses and ports as
		// on the wire, of a packet that reaches the socket.
		{&lv.tup, ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 12, MaxEntries: 1}},
	} {
		if *m.m, err = ebpf.NewMap(&m.spec); err != nil {
			return nil, fmt.Errorf("creating a map: %w", err)
		}
	}
	if err := lv.load(); err != nil {
		return nil, err
	}
	for _, a := range []link.RawAttachProgramOptions{
		{Target: lv.a.FD(), Program: lv.msg, Attach: ebpf.AttachSkMsgVerdict},
		{Target: lv.b.FD(), Program: lv.skb, Attach: ebpf.AttachSkSKBStreamVerdict},
	} {
		if err := link.RawAttachProgram(a); err != nil {
			return nil, fmt.Errorf("attaching %v: %w", a.Attach, err)
		}
	}
	// Key 0: the server, the redirect's target; the client joins too, for
	// its sends to meet the sk_msg program.
	for key, fd := range []int{lv.p.server, lv.p.client} {
		if err := lv.a.Update(uint32(key), uint64(fd), ebpf.UpdateAny); err != nil {
			return nil, fmt.Errorf("adding a socket to the map: %w", err)
		}
	}
	return lv, nil
}

func (lv *lateVerdict) load() error {
	var err error
	lv.msg, err = ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.SkMsg,
		License: "GPL",
		Instructions: slices.Concat(lookupFirst(lv.ctl), asm.Instructions{
			asm.JEq.Imm(asm.R0, 0, "pass"),
			asm.LoadMem(asm.R2, asm.R0, 0, asm.Word),
			asm.JEq.Imm(asm.R2, 0, "pass"),
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.LoadMapPtr(asm.R2, lv.a.FD()),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, -4), // key 0, still on the stack
			asm.Mov.Imm(asm.R4, 1),  // BPF_F_INGRESS
			asm.FnMsgRedirectHash.Call(),
			asm.Return(),
			asm.Mov.Imm(asm.R0, 1).WithSymbol("pass"), // SK_PASS
			asm.Return(),
		}),
	})
	if err != nil {
		return fmt.Errorf("loading the sk_msg program: %w", err)
	}
	lv.skb, err = ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SkSKB,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
	})
	if err != nil {
		return fmt.Errorf("loading the stream verdict: %w", err)
	}
	// Returns bpf_map_update_elem's result, 1 without a tuple, 2 where
	// no socket has it.
	lv.joiner, err = ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.SchedCLS,
		License: "GPL",
		Instructions: slices.Concat(lookupFirst(lv.tup), asm.Instructions{
			asm.JNE.Imm(asm.R0, 0, "found"),
			asm.Mov.Imm(asm.R0, 1),
			asm.Return(),
			asm.Mov.Reg(asm.R2, asm.R0).WithSymbol("found"),
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.Mov.Imm(asm.R3, 12),
			asm.Mov.Imm(asm.R4, -1), // BPF_F_CURRENT_NETNS
			asm.Mov.Imm(asm.R5, 0),
			asm.FnSkLookupTcp.Call(),
			asm.JNE.Imm(asm.R0, 0, "sock"),
			asm.Mov.Imm(asm.R0, 2),
			asm.Return(),
			asm.Mov.Reg(asm.R7, asm.R0).WithSymbol("sock"),
			asm.LoadMapPtr(asm.R1, lv.b.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4), // key 0
			asm.Mov.Reg(asm.R3, asm.R7),
			asm.Mov.Imm(asm.R4, 0), // BPF_ANY
			asm.FnMapUpdateElem.Call(),
			asm.Mov.Reg(asm.R8, asm.R0),
			asm.Mov.Reg(asm.R1, asm.R7),
			asm.FnSkRelease.Call(),
			asm.Mov.Reg(asm.R0, asm.R8),
			asm.Return(),
		}),
	})
	if err != nil {
		return fmt.Errorf("loading the tc program that joins the socket late: %w", err)
	}
	return nil
}

// lookupFirst keeps the context (R1) in R6, puts key 0 on the stack at
// -4 and looks it up in m: R0 is its value or NULL.
func lookupFirst(m *ebpf.Map) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.Mov.Imm(asm.R2, 0),
		asm.StoreMem(asm.RFP, -4, asm.R2, asm.Word),
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
	}
}

// send writes s from the client, redirected or through TCP, and gives TCP
// a moment to deliver.
func (lv *lateVerdict) send(redirect bool, s string) error {
	on := uint32(0)
	if redirect {
		on = 1
	}
	if err := lv.ctl.Update(uint32(0), on, ebpf.UpdateAny); err != nil {
		return err
	}
	if n, err := unix.Write(lv.p.client, []byte(s)); err != nil || n != len(s) {
		return fmt.Errorf("sending %q: %d bytes, %v", s, n, err)
	}
	time.Sleep(10 * time.Millisecond)
	return nil
}

// join adds the server socket to the verdict's map from the tc program,
// run on this thread (in the pair's network namespace).
func (lv *lateVerdict) join() error {
	local, err := unix.Getsockname(lv.p.server)
	if err != nil {
		return err
	}
	remote, err := unix.Getpeername(lv.p.server)
	if err != nil {
		return err
	}
	l, r := local.(*unix.SockaddrInet4), remote.(*unix.SockaddrInet4)
	// As a packet from the client would carry it: source the client.
	var tup [12]byte
	copy(tup[0:4], r.Addr[:])
	copy(tup[4:8], l.Addr[:])
	binary.BigEndian.PutUint16(tup[8:10], uint16(r.Port))
	binary.BigEndian.PutUint16(tup[10:12], uint16(l.Port))
	if err := lv.tup.Update(uint32(0), tup[:], ebpf.UpdateAny); err != nil {
		return err
	}
	ret, err := lv.joiner.Run(&ebpf.RunOptions{Data: make([]byte, 64)})
	if err != nil {
		return fmt.Errorf("running the tc program: %w", err)
	}
	if ret != 0 {
		return fmt.Errorf("the tc program returned %d (1: no tuple, 2: no socket, else the map update's error)", int32(ret))
	}
	var cookie uint64
	if err := lv.b.Lookup(uint32(0), &cookie); err != nil {
		return fmt.Errorf("the verdict's map holds no socket after the late join: %w", err)
	}
	return nil
}

func (lv *lateVerdict) close() {
	if lv.p != nil {
		lv.p.close()
	}
	for _, p := range []*ebpf.Program{lv.msg, lv.skb, lv.joiner} {
		if p != nil {
			p.Close()
		}
	}
	for _, m := range []*ebpf.Map{lv.a, lv.b, lv.ctl, lv.tup} {
		if m != nil {
			m.Close()
		}
	}
}

// readN reads n bytes from fd (a blocking socket with a receive timeout).
func readN(fd, n int) (string, error) {
	got := make([]byte, 0, n)
	buf := make([]byte, n)
	for len(got) < n {
		k, err := unix.Read(fd, buf[:n-len(got)])
		if err != nil {
			return string(got), fmt.Errorf("reading after %q: %w", got, err)
		}
		if k == 0 {
			return string(got), fmt.Errorf("end of stream after %q", got)
		}
		got = append(got, buf[:k]...)
	}
	return string(got), nil
}

// TestLateVerdictFromTimer: the late join of TestLateVerdict made by the
// kernel alone, at the send that needs it. A bpf_timer's callback runs
// with the rights of the program that set it: a tc program, run once by
// BPF_PROG_TEST_RUN, sets it, and the sk_msg program, which may not touch
// a socket map itself, only starts it as it redirects. The callback finds
// the server in the plain map by its key and adds it to a map carrying
// only a stream verdict (lateverdict.c). The evidence: the callback ran
// once and the map update succeeded; the server is in the verdict's map;
// and TCP's bytes sent next queue behind the redirected ones and ahead of
// the ones redirected after, as under the valve.
func TestLateVerdictFromTimer(t *testing.T) {
	testutil.RequireRoot(t)
	err := InPrivateNetns(func() error {
		var objs lateverdictObjects
		if err := loadLateverdictObjects(&objs, nil); err != nil {
			return fmt.Errorf("loading the programs (bpf_timer, 5.15 on): %w", err)
		}
		defer objs.Close()
		p, err := newPair(pairTCP)
		if err != nil {
			return err
		}
		defer p.close()
		for _, a := range []link.RawAttachProgramOptions{
			{Target: objs.LvPlain.FD(), Program: objs.LvMsg, Attach: ebpf.AttachSkMsgVerdict},
			{Target: objs.LvVerdict.FD(), Program: objs.LvSkb, Attach: ebpf.AttachSkSKBStreamVerdict},
		} {
			if err := link.RawAttachProgram(a); err != nil {
				return fmt.Errorf("attaching %v: %w", a.Attach, err)
			}
		}
		ret, err := objs.LvTimerInit.Run(&ebpf.RunOptions{Data: make([]byte, 64)})
		if err != nil || ret != 0 {
			return fmt.Errorf("setting the timer's callback: returned %d (100+: bpf_timer_init's error, 200+: bpf_timer_set_callback's), %v", ret, err)
		}
		for key, fd := range []int{p.server, p.client} {
			if err := objs.LvPlain.Update(uint32(key), uint64(fd), ebpf.UpdateAny); err != nil {
				return fmt.Errorf("adding a socket to the plain map: %w", err)
			}
		}
		send := func(mode lateverdictLvMode, s string) error {
			if err := objs.LvModes.Update(uint32(0), mode, ebpf.UpdateAny); err != nil {
				return err
			}
			if n, err := unix.Write(p.client, []byte(s)); err != nil || n != len(s) {
				return fmt.Errorf("sending %q: %d bytes, %v", s, n, err)
			}
			time.Sleep(10 * time.Millisecond)
			return nil
		}
		if err := send(lateverdictLvModeLV_JOIN, "red1"); err != nil {
			return err
		}
		var tm lateverdictLvTimer
		for i := 0; ; i++ {
			if err := objs.LvTimers.Lookup(uint32(0), &tm); err != nil {
				return err
			}
			if tm.Fired != 0 || i == 100 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		var cookie uint64
		joined := objs.LvVerdict.Lookup(uint32(0), &cookie) == nil
		t.Logf("timer started %d, fired %d, the map update returned %d; the server in the verdict's map: %v", tm.Started, tm.Fired, tm.Joined, joined)
		if tm.Started != 1 || tm.Fired != 1 || tm.Joined != 0 || !joined {
			return fmt.Errorf("the timer's late join: started %d, fired %d, update %d (%d: no socket), in the verdict's map %v; want 1, 1, 0, true",
				tm.Started, tm.Fired, tm.Joined, lateverdictLvConstLV_NO_SOCKET, joined)
		}
		if err := send(lateverdictLvModeLV_PASS, "tcp1"); err != nil {
			return err
		}
		if err := send(lateverdictLvModeLV_REDIRECT, "red2"); err != nil {
			return err
		}
		const want = "red1tcp1red2"
		got, err := readN(p.server, len(want))
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("read %q, want %q", got, want)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}
