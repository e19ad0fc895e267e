package datapath

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// Requirement is one thing the datapath's programs need from the kernel,
// read from the embedded objects (program and attach types, map types,
// helpers per program type), and the first Linux release that has it.
type Requirement struct {
	What  string `json:"what"`
	Since string `json:"since,omitempty"`
	probe func() error
	// under is the requirement this one is probed under (a helper's
	// program type): not named when that one is missing.
	under string
}

// MissingFeaturesError names everything the running kernel lacks.
type MissingFeaturesError struct {
	Kernel  string
	Missing []Requirement
}

func (e *MissingFeaturesError) Error() string {
	parts := make([]string, 0, len(e.Missing))
	for _, r := range e.Missing {
		if r.Since != "" {
			parts = append(parts, fmt.Sprintf("%s (Linux %s)", r.What, r.Since))
		} else {
			parts = append(parts, r.What+" (first release unknown to socklane)")
		}
	}
	need := "a newer kernel"
	if v := e.FirstKernel(); v != "" {
		need = "Linux " + v + " or later"
	}
	return fmt.Sprintf("kernel %s lacks what socklane's datapath needs: %s; run socklane on %s (tested on 6.1, 6.12 and 6.18: docs/kernels.md)",
		e.Kernel, strings.Join(parts, "; "), need)
}

// FirstKernel is the first release that has every missing feature ("" if
// one's release is unknown).
func (e *MissingFeaturesError) FirstKernel() string {
	best := ""
	for _, r := range e.Missing {
		if r.Since == "" {
			return ""
		}
		if best == "" || versionLess(best, r.Since) {
			best = r.Since
		}
	}
	return best
}

func versionLess(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(pa) && i < len(pb); i++ {
		x, _ := strconv.Atoi(pa[i])
		y, _ := strconv.Atoi(pb[i])
		if x != y {
			return x < y
		}
	}
	return len(pa) < len(pb)
}

// CheckKernel probes every requirement of the embedded datapath and load
// balancer objects and returns a *MissingFeaturesError naming all that the
// running kernel lacks. Other failures (not root, no BPF at all) are
// returned as they are.
func CheckKernel() error {
	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK, whose
	// default the probes soon exceed (EPERM); later ones need nothing.
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("lifting RLIMIT_MEMLOCK for BPF: %w", err)
	}
	b, err := loadBypass()
	if err != nil {
		return fmt.Errorf("loading embedded BPF object: %w", err)
	}
	l, err := loadServicelb()
	if err != nil {
		return fmt.Errorf("loading embedded service load balancer object: %w", err)
	}
	reqs := append(requirements(b, l), kptrRequirement())
	return checkRequirements(kernelRelease(), reqs)
}

func checkRequirements(kernel string, reqs []Requirement) error {
	var missing []Requirement
	lacks := map[string]bool{}
	for _, r := range reqs {
		if lacks[r.under] {
			continue
		}
		err := r.probe()
		switch {
		case err == nil:
		case errors.Is(err, ebpf.ErrNotSupported):
			missing = append(missing, r)
			lacks[r.What] = true
		default:
			return fmt.Errorf("probing %s: %w", r.What, err)
		}
	}
	if len(missing) > 0 {
		return &MissingFeaturesError{Kernel: kernel, Missing: missing}
	}
	return nil
}

func kernelRelease() string {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return "(unknown)"
	}
	return unix.ByteSliceToString(uts.Release[:])
}

// requirements lists, once each, what the specs' programs and maps use:
// program types, attach types the kernel checks at load, map types, and
// helpers per program type.
func requirements(specs ...*ebpf.CollectionSpec) []Requirement {
	var out []Requirement
	seen := map[string]bool{}
	add := func(r Requirement) {
		if !seen[r.What] {
			seen[r.What] = true
			out = append(out, r)
		}
	}
	for _, spec := range specs {
		for _, name := range sortedKeys(spec.Programs) {
			p := spec.Programs[name]
			pt := p.Type
			progType := "program type " + typeName(pt.String())
			add(Requirement{What: progType, Since: progTypeSince[pt],
				probe: func() error { return features.HaveProgramType(pt) }})
			if since, ok := attachSince[p.AttachType]; ok {
				at, flags := p.AttachType, p.Flags
				add(Requirement{What: "attach type " + typeName(at.String()), Since: since, under: progType,
					probe: func() error { return probeAttachType(pt, at, flags) }})
			}
			for _, ins := range p.Instructions {
				if !ins.IsBuiltinCall() {
					continue
				}
				fn := asm.BuiltinFunc(ins.Constant)
				add(Requirement{
					What:  fmt.Sprintf("helper bpf_%s for %s programs", typeName(fn.String()), typeName(pt.String())),
					Since: helperSince(pt, fn),
					under: progType,
					probe: func() error { return features.HaveProgramHelper(pt, fn) },
				})
			}
		}
		for _, name := range sortedKeys(spec.Maps) {
			mt := spec.Maps[name].Type
			add(Requirement{What: "map type " + typeName(mt.String()), Since: mapTypeSince[mt],
				probe: func() error { return features.HaveMapType(mt) }})
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// kptrRequirement: socket pointers kept in map values (BTF type tags
// parsed as kernel pointers, tagged kptr before 6.3 and kptr_untrusted
// since).
func kptrRequirement() Requirement {
	return Requirement{What: "kernel pointers in map values (BTF kptr fields)", Since: "5.19", probe: func() error {
		for _, tag := range []string{"kptr_untrusted", "kptr"} {
			if ok, err := probeKptrTag(tag, ebpf.Array); err == nil && ok {
				return nil
			}
		}
		return ebpf.ErrNotSupported
	}}
}

// probeAttachType loads a program that returns 1 with the attach type the
// kernel checks at load: an attach type it does not know fails with EINVAL.
func probeAttachType(pt ebpf.ProgramType, at ebpf.AttachType, flags uint32) error {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: pt, AttachType: at, Flags: flags, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
	})
	if err == nil {
		p.Close()
		return nil
	}
	if errors.Is(err, unix.EINVAL) || errors.Is(err, ebpf.ErrNotSupported) {
		return ebpf.ErrNotSupported
	}
	return err
}

// typeName turns cilium/ebpf's names (SkMsg, FnGetNetnsCookie,
// CGroupInet4Connect) into the kernel's (sk_msg, get_netns_cookie,
// cgroup_inet4_connect).
func typeName(s string) string {
	s = strings.TrimPrefix(s, "Fn")
	s = strings.TrimPrefix(s, "Attach")
	s = strings.ReplaceAll(s, "CGroup", "Cgroup")
	var b strings.Builder
	rs := []rune(s)
	for i, r := range rs {
		if unicode.IsUpper(r) {
			prevLower := i > 0 && (unicode.IsLower(rs[i-1]) || unicode.IsDigit(rs[i-1]))
			nextLower := i > 0 && i+1 < len(rs) && unicode.IsLower(rs[i+1]) && unicode.IsUpper(rs[i-1])
			if prevLower || nextLower {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// First releases, from the kernel's history (helpers as added; a helper a
// program type got later is listed per type).
var (
	progTypeSince = map[ebpf.ProgramType]string{
		ebpf.CGroupSock: "4.10", ebpf.SockOps: "4.13", ebpf.SkMsg: "4.17", ebpf.SkSKB: "4.14",
		ebpf.CGroupSockAddr: "4.17", ebpf.Syscall: "5.14", ebpf.CGroupSKB: "4.10", ebpf.SchedCLS: "4.1",
	}
	attachSince = map[ebpf.AttachType]string{
		ebpf.AttachCGroupInet4Connect: "4.17", ebpf.AttachCGroupInet6Connect: "4.17",
		ebpf.AttachCGroupUDP4Sendmsg: "4.18", ebpf.AttachCGroupUDP6Sendmsg: "4.18",
		ebpf.AttachCGroupUDP4Recvmsg: "5.2", ebpf.AttachCGroupUDP6Recvmsg: "5.2",
		ebpf.AttachCgroupInet4GetPeername: "5.8", ebpf.AttachCgroupInet6GetPeername: "5.8",
		ebpf.AttachCgroupInetSockRelease: "5.9", ebpf.AttachCGroupInetIngress: "4.10",
	}
	mapTypeSince = map[ebpf.MapType]string{
		ebpf.Hash: "3.19", ebpf.Array: "3.19", ebpf.PerCPUArray: "4.6", ebpf.LRUHash: "4.10",
		ebpf.SockMap: "4.14", ebpf.SockHash: "4.18", ebpf.Queue: "4.20", ebpf.SkStorage: "5.2", ebpf.RingBuf: "5.8",
		ebpf.LPMTrie: "4.11",
	}
	helperAdded = map[asm.BuiltinFunc]string{
		asm.FnMapLookupElem: "3.19", asm.FnMapUpdateElem: "3.19", asm.FnMapDeleteElem: "3.19",
		asm.FnKtimeGetNs: "4.1", asm.FnGetPrandomU32: "4.1", asm.FnGetSocketCookie: "4.12",
		asm.FnSockOpsCbFlagsSet: "4.16", asm.FnMsgApplyBytes: "4.17", asm.FnMsgPullData: "4.17",
		asm.FnSockMapUpdate: "4.14", asm.FnMsgRedirectMap: "4.17",
		asm.FnMsgRedirectHash: "4.18", asm.FnSockHashUpdate: "4.18", asm.FnGetCurrentCgroupId: "4.18",
		asm.FnMapPushElem: "4.20", asm.FnMapPopElem: "4.20", asm.FnSkStorageGet: "5.2",
		asm.FnProbeReadKernel: "5.5", asm.FnGetNetnsCookie: "5.7", asm.FnRingbufReserve: "5.8",
		asm.FnRingbufSubmit: "5.8", asm.FnSkcToTcpSock: "5.9", asm.FnSetRetval: "5.18",
		asm.FnSkbLoadBytes: "4.5", asm.FnSkFullsock: "5.1", asm.FnGetCurrentAncestorCgroupId: "5.7",
		asm.FnGetCurrentTask: "4.8", asm.FnSkbCgroupId: "4.18",
		asm.FnTimerInit: "5.15", asm.FnTimerSetCallback: "5.15", asm.FnTimerStart: "5.15",
		asm.FnSetsockopt: "4.13", asm.FnGetsockopt: "4.15", asm.FnSkbAdjustRoom: "4.13", asm.FnLoop: "5.17",
		asm.FnSkRelease: "4.20", asm.FnGetSmpProcessorId: "4.1",
	}
	// Helpers that came to a program type later than to tracing: the
	// base helpers of CAP_PERFMON (the current task, reading kernel
	// memory) reached every program type in 5.8.
	helperPerType = map[ebpf.ProgramType]map[asm.BuiltinFunc]string{
		ebpf.SockOps: {asm.FnGetNetnsCookie: "5.15", asm.FnGetCurrentTask: "5.8"},
		ebpf.SkMsg:   {asm.FnGetNetnsCookie: "5.15", asm.FnGetCurrentTask: "5.8"},
		// bpf_skb_cgroup_id came to cgroup_skb in 5.3.
		ebpf.CGroupSKB: {asm.FnSkbCgroupId: "5.3"},
		// bpf_skb_adjust_room came to sk_skb (popping bytes off the
		// head of an ingress skb) in 5.10.
		ebpf.SkSKB: {asm.FnSkbAdjustRoom: "5.10"},
	}
)

func helperSince(pt ebpf.ProgramType, fn asm.BuiltinFunc) string {
	if v, ok := helperPerType[pt][fn]; ok {
		return v
	}
	return helperAdded[fn]
}
