package datapath

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/service"
)

// hook is one program attached to every managed cgroup.
type hook struct {
	name   string // link pin name part
	attach ebpf.AttachType
	prog   func(d *Datapath) *ebpf.Program
}

// hooks are attached in this order: the service load balancer before
// sock_ops, so that a connection's first socket operation already sees
// its translated address.
var hooks = []hook{
	{"connect4", ebpf.AttachCGroupInet4Connect, func(d *Datapath) *ebpf.Program { return d.lb.SlConnect4 }},
	{"connect6", ebpf.AttachCGroupInet6Connect, func(d *Datapath) *ebpf.Program { return d.lb.SlConnect6 }},
	{"sendmsg4", ebpf.AttachCGroupUDP4Sendmsg, func(d *Datapath) *ebpf.Program { return d.lb.SlSendmsg4 }},
	{"sendmsg6", ebpf.AttachCGroupUDP6Sendmsg, func(d *Datapath) *ebpf.Program { return d.lb.SlSendmsg6 }},
	{"recvmsg4", ebpf.AttachCGroupUDP4Recvmsg, func(d *Datapath) *ebpf.Program { return d.lb.SlRecvmsg4 }},
	{"recvmsg6", ebpf.AttachCGroupUDP6Recvmsg, func(d *Datapath) *ebpf.Program { return d.lb.SlRecvmsg6 }},
	{"getpeername4", ebpf.AttachCgroupInet4GetPeername, func(d *Datapath) *ebpf.Program { return d.lb.SlGetpeername4 }},
	{"getpeername6", ebpf.AttachCgroupInet6GetPeername, func(d *Datapath) *ebpf.Program { return d.lb.SlGetpeername6 }},
	{"sockrelease", ebpf.AttachCgroupInetSockRelease, func(d *Datapath) *ebpf.Program { return d.lb.SlSockRelease }},
	{"release", ebpf.AttachCgroupInetSockRelease, func(d *Datapath) *ebpf.Program { return d.objs.SlRelease }},
	{hookSockops, ebpf.AttachCGroupSockOps, func(d *Datapath) *ebpf.Program { return d.objs.SlSockops }},
}

func loadLBSpec() (*ebpf.CollectionSpec, error) {
	spec, err := loadServicelb()
	if err != nil {
		return nil, fmt.Errorf("loading embedded service load balancer object: %w", err)
	}
	for _, m := range spec.Maps {
		if strings.HasPrefix(m.Name, "sl_") {
			m.Pinning = ebpf.PinByName
		}
	}
	return spec, nil
}

// lbPrograms maps pin names to the load balancer's program fields.
func (d *Datapath) lbPrograms() map[string]**ebpf.Program {
	p := &d.lb.servicelbPrograms
	return map[string]**ebpf.Program{
		servicelbProgSlConnect4: &p.SlConnect4, servicelbProgSlConnect6: &p.SlConnect6,
		servicelbProgSlSendmsg4: &p.SlSendmsg4, servicelbProgSlSendmsg6: &p.SlSendmsg6,
		servicelbProgSlRecvmsg4: &p.SlRecvmsg4, servicelbProgSlRecvmsg6: &p.SlRecvmsg6,
		servicelbProgSlGetpeername4: &p.SlGetpeername4, servicelbProgSlGetpeername6: &p.SlGetpeername6,
		servicelbProgSlSockRelease: &p.SlSockRelease,
		servicelbProgSlLbForget:    &p.SlLbForget,
		servicelbProgSlPolIngress:  &p.SlPolIngress,
	}
}

// createLB loads the load balancer, with the settings the bypass loaded
// with, into the pin directory and pins its programs.
func (d *Datapath) createLB(loaded Settings) error {
	spec, err := loadLBSpec()
	if err != nil {
		return err
	}
	if err := loaded.set(spec, servicelbVarSlSettings); err != nil {
		return err
	}
	if err := spec.LoadAndAssign(&d.lb, d.loadOptions()); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return fmt.Errorf("loading service load balancer (verifier rejected it): %+v", ve)
		}
		return fmt.Errorf("loading service load balancer: %w", err)
	}
	for name, p := range d.lbPrograms() {
		if err := (*p).Pin(filepath.Join(d.cfg.PinDir, progPinPrefix+name)); err != nil {
			return fmt.Errorf("pinning %s: %w", name, err)
		}
	}
	return nil
}

// adoptLB reuses the pinned load balancer maps and programs.
func (d *Datapath) adoptLB() error {
	spec, err := loadLBSpec()
	if err != nil {
		return err
	}
	maps := struct{ servicelbMaps }{}
	if err := spec.LoadAndAssign(&maps, d.loadOptions()); err != nil {
		return fmt.Errorf("adopting pinned service maps in %s: %w: %w", d.cfg.PinDir, ErrIncompatible, err)
	}
	d.lb.servicelbMaps = maps.servicelbMaps
	for name, p := range d.lbPrograms() {
		prog, err := ebpf.LoadPinnedProgram(filepath.Join(d.cfg.PinDir, progPinPrefix+name), nil)
		if err != nil {
			return fmt.Errorf("adopting pinned %s: %w", name, err)
		}
		*p = prog
	}
	return nil
}

// ServiceBudget is what the load balancer's tables hold.
func (d *Datapath) ServiceBudget() service.Budget {
	return service.Budget{Frontends: int(d.lb.SlSvc.MaxEntries()), BackendSlots: int(d.lb.SlSvcBackends.MaxEntries()),
		MaglevTables: int(d.lb.SlSvcMaglev.MaxEntries())}
}

// SetServiceOptOut leaves the sockets of the network namespace whose
// cookie is netns to the node's per-packet proxy (out), or balances them
// at connect() again.
func (d *Datapath) SetServiceOptOut(netns uint64, out bool) error {
	return setOptOut(d.lb.SlLbOptout, "service", netns, out)
}

// ServiceOptOuts lists the network namespaces opted out, by cookie.
func (d *Datapath) ServiceOptOuts() ([]uint64, error) {
	return optOuts(d.lb.SlLbOptout, "sl_lb_optout")
}
