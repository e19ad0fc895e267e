package datapath

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
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
}

// Adapted says, per feature missing, what the datapath does instead.
func (f Features) Adapted() []string {
	var out []string
	if !f.KptrUntrusted {
		out = append(out, "socket pointers in maps tagged kptr (the pre-6.3 name of kptr_untrusted)")
	}
	if !f.PsockMsgTotLen {
		out = append(out, "receiver backlog rule off: the kernel's sk_psock has no msg_tot_len (only whether bytes are queued is read)")
	}
	return out
}

// ProbeFeatures probes the running kernel.
func ProbeFeatures() (Features, error) {
	var f Features
	var uts unix.Utsname
	if err := unix.Uname(&uts); err == nil {
		f.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	kspec, err := btf.LoadKernelSpec()
	if err != nil {
		return f, fmt.Errorf("reading the kernel's BTF (socklane needs CONFIG_DEBUG_INFO_BTF): %w", err)
	}
	var psock *btf.Struct
	if err := kspec.TypeByName("sk_psock", &psock); err == nil {
		for _, m := range psock.Members {
			f.PsockMsgTotLen = f.PsockMsgTotLen || m.Name == "msg_tot_len"
		}
	}
	if f.KptrUntrusted, err = probeKptrTag("kptr_untrusted"); err != nil {
		return f, fmt.Errorf("probing kptr_untrusted map fields: %w", err)
	}
	return f, nil
}

// probeKptrTag reports whether the kernel parses a map value's pointer
// field tagged tag as a kernel pointer: the verifier then refuses a program
// storing a number into it. A tag the kernel does not know leaves a plain
// 8-byte field, where the store is fine.
func probeKptrTag(tag string) (bool, error) {
	sock := &btf.Struct{Name: "sock"}
	val := &btf.Struct{Name: "sl_probe_val", Size: 8, Members: []btf.Member{
		{Name: "sk", Type: &btf.Pointer{Target: &btf.TypeTag{Value: tag, Type: sock}}},
	}}
	m, err := ebpf.NewMap(&ebpf.MapSpec{
		Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1,
		Key: &btf.Int{Name: "u32", Size: 4}, Value: val,
	})
	if err != nil {
		return false, fmt.Errorf("creating probe map: %w", err)
	}
	defer m.Close()
	return fieldIsKptr(m)
}

// fieldIsKptr reports whether the kernel took the first 8 bytes of m's
// values for a kernel pointer: the verifier then refuses a program storing
// a number there.
func fieldIsKptr(m *ebpf.Map) (bool, error) {
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
			asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
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
func (f Features) adapt(spec *ebpf.CollectionSpec) {
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
