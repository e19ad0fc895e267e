package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/socklane/socklane/internal/sockbugs"
	"golang.org/x/sys/unix"
)

// Features is what the running kernel offers the datapath, probed at open
// (not inferred from the version), and what was adapted to it.
type Features struct {
	Kernel string `json:"kernel"`
	// KptrUntrusted: map fields tagged kptr_untrusted are unreferenced
	// kernel pointers (Linux 6.3+). Before, the same fields are tagged
	// kptr, which 6.3 gave to referenced pointers: the loader retags.
	KptrUntrusted bool `json:"kptr_untrusted"`
	// PsockMsgTotLen: struct sk_psock counts the bytes redirected into a
	// socket and not yet read (msg_tot_len). Without it the datapath
	// still knows whether any are queued (what leaving the map safely
	// needs), but not how many: the receiver backlog rule is off.
	PsockMsgTotLen bool `json:"psock_msg_tot_len"`
	// CastKernCtx: the kfunc bpf_cast_to_kern_ctx (6.3+), through which
	// the valve's sk_skb verdict reads a TCP segment's sequence number, to
	// cut off the head of a retransmission that repeats bytes already
	// passed (sl_skb).
	CastKernCtx bool `json:"cast_kern_ctx"`
	// HashKptr: the socket pointer in sl_listeners' value (a hash map) is
	// parsed as a kernel pointer, probed on the map itself when the spec
	// is adapted (some layouts are not on 6.1, which then makes the field
	// a plain number): listeners keep a pointer to their socket, else
	// only its mode at listen().
	HashKptr bool `json:"hash_kptr"`
	// HostNetns is the network namespace cookie of the prober (the
	// agent runs in the host's): host-only service balancing keys by it.
	HostNetns uint64 `json:"host_netns"`
	// Bugs are the sockmap bugs found by behaviour when the datapath was
	// created (internal/sockbugs), and why none could be, if so.
	Bugs      []sockbugs.Bug `json:"bugs"`
	BugsError string         `json:"bugs_error,omitempty"`
}

// Adapted says, per feature missing, what the datapath does instead.
func (f Features) Adapted() []string {
	var out []string
	if !f.KptrUntrusted {
		out = append(out, "socket pointers in maps tagged kptr (the pre-6.3 name of kptr_untrusted)")
	}
	if !f.HashKptr {
		out = append(out, "a listener's mode is read at listen() only (no socket pointer in a hash map's value): servers that go non-blocking after listen() have their first connections kept on TCP")
	}
	if !f.PsockMsgTotLen {
		out = append(out, "receiver backlog rule off: the kernel's sk_psock has no msg_tot_len (only whether bytes are queued is read)")
	}
	return out
}

// Summary is one line: the features and what was adapted, and the bugs.
func (f Features) Summary() string {
	bugs := []string{}
	for _, b := range f.Bugs {
		bugs = append(bugs, b.Name)
	}
	if f.BugsError != "" {
		bugs = append(bugs, "(not probed: "+f.BugsError+")")
	}
	adapted := f.Adapted()
	if len(adapted) == 0 {
		adapted = []string{"nothing"}
	}
	return fmt.Sprintf("kptr_untrusted %v, kptr in hash maps %v, sk_psock.msg_tot_len %v; adapted: %s; sockmap bugs found: %s",
		f.KptrUntrusted, f.HashKptr, f.PsockMsgTotLen, strings.Join(adapted, "; "), strings.Join(bugs, ", "))
}

// ValveUnfit says why the valve (--slow-readers valve) cannot run on this
// kernel, or "" where it can. The valve reads a reader's queue (sk_psock's
// msg_tot_len) and holds its writer on TCP, whose window follows the
// reader's memory: that paces the writer only where the kernel charges
// redirected bytes to their reader (found by behaviour: redirect_uncharged
// absent). A kernel whose sockmap could not be probed is not trusted.
func (f Features) ValveUnfit() string {
	switch {
	case !f.PsockMsgTotLen:
		return "its sk_psock does not count the bytes queued for a reader (no msg_tot_len)"
	case !f.CastKernCtx:
		return "its sk_skb verdict cannot read a TCP segment's sequence number (no bpf_cast_to_kern_ctx, 6.3), so a retransmission that repeats bytes already delivered would reach the reader twice"
	case f.BugsError != "":
		return "its sockmap could not be probed (" + f.BugsError + ")"
	case f.Has(sockbugs.Uncharged):
		return "it does not charge redirected bytes to their reader's memory, so TCP's window cannot pace the writer (redirect_uncharged; fixed by " + sockbugs.Describe(sockbugs.Uncharged).Fix + ")"
	}
	return ""
}

// ValveFit reports whether the valve can run on this kernel (ValveUnfit).
func (f Features) ValveFit() bool { return f.ValveUnfit() == "" }

// ProbeFeatures probes the running kernel and its sockmap bugs, as a
// datapath being created does.
func ProbeFeatures() (Features, error) {
	f, err := probeFeatures(btf.NewCache())
	if err == nil {
		f.setBugs(sockbugs.Detect())
	}
	return f, err
}

// probeFeatures probes the running kernel, reading its types from types
// (decoded once for the probe and every collection loaded after it).
func probeFeatures(types *btf.Cache) (Features, error) {
	var f Features
	var uts unix.Utsname
	if err := unix.Uname(&uts); err == nil {
		f.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	kspec, err := types.Kernel()
	if err != nil {
		return f, fmt.Errorf("reading the kernel's BTF (socklane needs CONFIG_DEBUG_INFO_BTF): %w", err)
	}
	var psock *btf.Struct
	if err := kspec.TypeByName("sk_psock", &psock); err == nil {
		for _, m := range psock.Members {
			f.PsockMsgTotLen = f.PsockMsgTotLen || m.Name == "msg_tot_len"
		}
	}
	var cast *btf.Func
	f.CastKernCtx = kspec.TypeByName("bpf_cast_to_kern_ctx", &cast) == nil
	if f.KptrUntrusted, err = probeKptrTag("kptr_untrusted", ebpf.Array); err != nil {
		return f, fmt.Errorf("probing kptr_untrusted map fields: %w", err)
	}
	if f.HostNetns, err = ownNetnsCookie(); err != nil {
		return f, err
	}
	return f, nil
}

// probeKptrTag reports whether the kernel parses a map value's pointer
// field tagged tag as a kernel pointer: the verifier then refuses a program
// storing a number into it. A tag the kernel does not know leaves a plain
// 8-byte field, where the store is fine.
func probeKptrTag(tag string, typ ebpf.MapType) (bool, error) {
	sock := &btf.Struct{Name: "sock"}
	val := &btf.Struct{Name: "sl_probe_val", Size: 8, Members: []btf.Member{
		{Name: "sk", Type: &btf.Pointer{Target: &btf.TypeTag{Value: tag, Type: sock}}},
	}}
	m, err := ebpf.NewMap(&ebpf.MapSpec{
		Type: typ, KeySize: 4, ValueSize: 8, MaxEntries: 1,
		Key: &btf.Int{Name: "u32", Size: 4}, Value: val,
	})
	if err != nil {
		return false, fmt.Errorf("creating probe map: %w", err)
	}
	defer m.Close()
	return fieldIsKptr(m, 0)
}

// fieldIsKptr reports whether the kernel took the 8 bytes at off of m's
// values for a kernel pointer: the verifier then refuses a program storing
// a number there.
func fieldIsKptr(m *ebpf.Map, off int16) (bool, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.SocketFilter,
		License: "GPL",
		Instructions: asm.Instructions{
			// A zero key of up to 16 bytes.
			asm.Mov.Imm(asm.R1, 0),
			asm.StoreMem(asm.RFP, -16, asm.R1, asm.DWord),
			asm.StoreMem(asm.RFP, -8, asm.R1, asm.DWord),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -16),
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "out"),
			asm.Mov.Imm(asm.R1, 1),
			asm.StoreMem(asm.R0, off, asm.R1, asm.DWord),
			asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
			asm.Return(),
		},
	})
	if err == nil {
		prog.Close()
		return false, nil
	}
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) && strings.Contains(strings.Join(ve.Log, "\n"), "kptr") {
		return true, nil
	}
	return false, fmt.Errorf("loading probe program: %w", err)
}

// adapt rewrites spec for what the kernel lacks.
func (f *Features) adapt(spec *ebpf.CollectionSpec) error {
	f.retag(spec)
	var err error
	if f.HashKptr, err = listenerKptr(spec); err != nil {
		return err
	}
	return nil
}

// listenerKptr makes a one-entry sl_listeners as the spec has it and asks
// the verifier whether its socket pointer is one.
func listenerKptr(spec *ebpf.CollectionSpec) (bool, error) {
	ms := spec.Maps[bypassMapSlListeners].Copy()
	ms.Pinning, ms.MaxEntries = ebpf.PinNone, 1
	m, err := ebpf.NewMap(ms)
	if err != nil {
		return false, fmt.Errorf("probing sl_listeners: %w", err)
	}
	defer m.Close()
	ok, err := fieldIsKptr(m, int16(binary.Size(bypassSlListenerInfo{})))
	if err != nil {
		return false, fmt.Errorf("probing sl_listeners' socket pointer: %w", err)
	}
	return ok, nil
}

// retag gives the spec's kernel pointer fields the tag this kernel knows.
func (f Features) retag(spec *ebpf.CollectionSpec) {
	if f.KptrUntrusted {
		return
	}
	for _, m := range spec.Maps {
		st, ok := m.Value.(*btf.Struct)
		if !ok {
			continue
		}
		for _, mem := range st.Members {
			if p, ok := mem.Type.(*btf.Pointer); ok {
				if tt, ok := p.Target.(*btf.TypeTag); ok && tt.Value == "kptr_untrusted" {
					tt.Value = "kptr"
				}
			}
		}
	}
}

// ownNetnsCookie is the cookie of the calling thread's network namespace.
func ownNetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("reading this network namespace's cookie: %w", err)
	}
	defer unix.Close(fd)
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("reading this network namespace's cookie (SO_NETNS_COOKIE, Linux 5.14): %w", err)
	}
	return c, nil
}
