package datapath

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
)

// portLinkPrefix names the pinned links of the port virtualization hooks:
// they are attached only while rules exist, to workloads' cgroups as well
// as the datapath's, and are not datapath attachments.
const portLinkPrefix = "ptlink_"

// portHooks are the port virtualization programs, attached together.
var portHooks = []hook{
	{"bind4", ebpf.AttachCGroupInet4Bind, func(d *Datapath) *ebpf.Program { return d.pt.SlPtBind4 }},
	{"bind6", ebpf.AttachCGroupInet6Bind, func(d *Datapath) *ebpf.Program { return d.pt.SlPtBind6 }},
	{"getsockname4", ebpf.AttachCgroupInet4GetSockname, func(d *Datapath) *ebpf.Program { return d.pt.SlPtGetsockname4 }},
	{"getsockname6", ebpf.AttachCgroupInet6GetSockname, func(d *Datapath) *ebpf.Program { return d.pt.SlPtGetsockname6 }},
	{"connect4", ebpf.AttachCGroupInet4Connect, func(d *Datapath) *ebpf.Program { return d.pt.SlPtConnect4 }},
	{"connect6", ebpf.AttachCGroupInet6Connect, func(d *Datapath) *ebpf.Program { return d.pt.SlPtConnect6 }},
	{"sendmsg4", ebpf.AttachCGroupUDP4Sendmsg, func(d *Datapath) *ebpf.Program { return d.pt.SlPtSendmsg4 }},
	{"sendmsg6", ebpf.AttachCGroupUDP6Sendmsg, func(d *Datapath) *ebpf.Program { return d.pt.SlPtSendmsg6 }},
	{"recvmsg4", ebpf.AttachCGroupUDP4Recvmsg, func(d *Datapath) *ebpf.Program { return d.pt.SlPtRecvmsg4 }},
	{"recvmsg6", ebpf.AttachCGroupUDP6Recvmsg, func(d *Datapath) *ebpf.Program { return d.pt.SlPtRecvmsg6 }},
	{"getpeername4", ebpf.AttachCgroupInet4GetPeername, func(d *Datapath) *ebpf.Program { return d.pt.SlPtGetpeername4 }},
	{"getpeername6", ebpf.AttachCgroupInet6GetPeername, func(d *Datapath) *ebpf.Program { return d.pt.SlPtGetpeername6 }},
	{"release", ebpf.AttachCgroupInetSockRelease, func(d *Datapath) *ebpf.Program { return d.pt.SlPtRelease }},
}

func loadPortsSpec() (*ebpf.CollectionSpec, error) {
	spec, err := loadPorts()
	if err != nil {
		return nil, fmt.Errorf("loading embedded port virtualization object: %w", err)
	}
	for _, m := range spec.Maps {
		if strings.HasPrefix(m.Name, "sl_") {
			m.Pinning = ebpf.PinByName
		}
	}
	return spec, nil
}

// portPrograms maps pin names to the port programs' fields.
func (d *Datapath) portPrograms() map[string]**ebpf.Program {
	p := &d.pt.portsPrograms
	return map[string]**ebpf.Program{
		portsProgSlPtBind4: &p.SlPtBind4, portsProgSlPtBind6: &p.SlPtBind6,
		portsProgSlPtGetsockname4: &p.SlPtGetsockname4, portsProgSlPtGetsockname6: &p.SlPtGetsockname6,
		portsProgSlPtConnect4: &p.SlPtConnect4, portsProgSlPtConnect6: &p.SlPtConnect6,
		portsProgSlPtSendmsg4: &p.SlPtSendmsg4, portsProgSlPtSendmsg6: &p.SlPtSendmsg6,
		portsProgSlPtRecvmsg4: &p.SlPtRecvmsg4, portsProgSlPtRecvmsg6: &p.SlPtRecvmsg6,
		portsProgSlPtGetpeername4: &p.SlPtGetpeername4, portsProgSlPtGetpeername6: &p.SlPtGetpeername6,
		portsProgSlPtRelease: &p.SlPtRelease,
	}
}

// createPorts loads the port virtualization programs into the pin
// directory (sharing the event ring) and pins them.
func (d *Datapath) createPorts() error {
	spec, err := loadPortsSpec()
	if err != nil {
		return err
	}
	if err := spec.LoadAndAssign(&d.pt, d.loadOptions()); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return fmt.Errorf("loading port virtualization (verifier rejected it): %+v", ve)
		}
		return fmt.Errorf("loading port virtualization: %w", err)
	}
	for name, p := range d.portPrograms() {
		if err := (*p).Pin(filepath.Join(d.cfg.PinDir, progPinPrefix+name)); err != nil {
			return fmt.Errorf("pinning %s: %w", name, err)
		}
	}
	return nil
}

// adoptPorts reuses the pinned port maps and programs.
func (d *Datapath) adoptPorts() error {
	spec, err := loadPortsSpec()
	if err != nil {
		return err
	}
	maps := struct{ portsMaps }{}
	if err := spec.LoadAndAssign(&maps, d.loadOptions()); err != nil {
		return fmt.Errorf("adopting pinned port maps in %s: %w: %w", d.cfg.PinDir, ErrIncompatible, err)
	}
	d.pt.portsMaps = maps.portsMaps
	for name, p := range d.portPrograms() {
		prog, err := ebpf.LoadPinnedProgram(filepath.Join(d.cfg.PinDir, progPinPrefix+name), nil)
		if err != nil {
			return fmt.Errorf("adopting pinned %s: %w: %w", name, ErrIncompatible, err)
		}
		*p = prog
	}
	return nil
}

// PortTargets lists the cgroups the port hooks are attached to.
func (d *Datapath) PortTargets() ([]uint64, error) { return Pins(d.cfg.PinDir).targets(portLinkPrefix) }

// udpOnly reports whether a port hook serves only unconnected UDP sends
// and receives (it runs for every such datagram).
func udpOnly(h hook) bool {
	switch h.attach {
	case ebpf.AttachCGroupUDP4Sendmsg, ebpf.AttachCGroupUDP6Sendmsg, ebpf.AttachCGroupUDP4Recvmsg, ebpf.AttachCGroupUDP6Recvmsg:
		return true
	}
	return false
}

// SetPortTargets attaches the port virtualization hooks to exactly the
// cgroups of want (id -> path): new ones attached, others detached; the
// hooks of unconnected UDP datagrams only if udp (some rule has a UDP
// virtual port), since they run for every datagram. Only socklane's own
// port links are touched. On an attach failure the hooks this call
// attached are detached again and the error returned.
func (d *Datapath) SetPortTargets(want map[uint64]string, udp bool) error {
	if _, err := d.attachTargets(portLinkPrefix, portHooks, want, func(h hook) bool { return udpOnly(h) && !udp }); err != nil {
		return fmt.Errorf("attaching port hooks: %w", err)
	}
	return d.detachTargetsBut(portLinkPrefix, portHooks, want)
}

// PortCounterNames names the per-workload port counters (from BTF).
func PortCounterNames() ([]string, error) {
	spec, err := loadPorts()
	if err != nil {
		return nil, fmt.Errorf("loading embedded BPF object: %w", err)
	}
	return enumNames(spec, "sl_pt_counter", "SL_PT_C_", len(portsSlPtCount{}.C))
}
