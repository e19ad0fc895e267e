// Package datapath loads, pins, attaches and reads the bypass datapath:
// the sl_sockops program on cgroups, the sl_msg program on the socket maps
// (sl_sockmap and sl_sockmap_plain), and the maps they share.
package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/socklane/socklane/internal/sockbugs"
)

// Names of the pinned programs; maps are pinned under their own names.
const (
	progPinPrefix  = "prog_"
	progPinSockops = progPinPrefix + bypassProgSlSockops
	progPinMsg     = progPinPrefix + bypassProgSlMsg
	progPinRelease = progPinPrefix + bypassProgSlRelease
	progPinReclaim = progPinPrefix + bypassProgSlReclaim
	progPinSeed    = progPinPrefix + bypassProgSlSeedListener
	linkPinPrefix  = "link_"
	// hookSockops names sl_sockops's attachment in link pins; its link
	// id identifies an attachment.
	hookSockops = "sockops"
)

// Config says where the datapath lives and what a new load of it asks for.
type Config struct {
	// PinDir is the directory on a bpf filesystem holding every pinned
	// object of this datapath instance.
	PinDir string
	// Settings a new load asks for (DefaultSettings when zero is not
	// meant); an adopted datapath keeps those it was loaded with.
	Settings Settings
}

// Datapath is a loaded (fresh or adopted) bypass datapath.
type Datapath struct {
	cfg     Config
	objs    bypassObjects
	lb      servicelbObjects
	pt      portsObjects
	adopted bool
	// layout locates the settings in the programs' read-only data.
	layout settingsLayout
	// counterNames and lbCounterNames index the counter arrays, read
	// from the object once: a scrape reads the counters only.
	counterNames, lbCounterNames []string
	// features is what the kernel offered at open.
	features Features
	// lbm mirrors the service maps between applies (nil: read them).
	lbm *lbMirror
	// types holds the kernel's BTF, decoded once per open for the
	// feature probe and the three collections' relocations (each
	// decoding of its own took a tenth of a load); nil once Open is done.
	types *btf.Cache
}

// loadOptions are the options every collection of the datapath is loaded
// or adopted with: maps pinned in the pin directory, kernel types shared.
func (d *Datapath) loadOptions() *ebpf.CollectionOptions {
	return &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: d.cfg.PinDir}, Cache: d.types}
}

// Features is what the kernel offered the datapath, and what was adapted.
func (d *Datapath) Features() Features { return d.features }

// Pinned reports whether a datapath is pinned in dir.
func Pinned(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, progPinMsg))
	return err == nil
}

// Open adopts the datapath pinned in cfg.PinDir, or loads and pins a new one.
// Adopting never touches live sockets: maps, programs and attachments stay as
// they are.
func Open(cfg Config) (*Datapath, error) {
	if cfg.PinDir == "" {
		return nil, errors.New("datapath: empty pin directory")
	}
	// A kernel that lacks what the programs use is refused by name before
	// anything is created.
	creating := !Pinned(cfg.PinDir)
	open := adopt
	if creating {
		open = create
		if err := CheckKernel(); err != nil {
			return nil, err
		}
	}
	types := btf.NewCache()
	f, err := probeFeatures(types)
	if err != nil {
		return nil, err
	}
	if creating {
		// The sockmap bugs decide the settings left to the kernel and
		// whether the valve can run: found first, in a network namespace
		// of their own, recorded once loaded.
		f.setBugs(sockbugs.Detect())
		if why := f.ValveUnfit(); cfg.Settings.BacklogValve.On() && why != "" {
			return nil, fmt.Errorf("--slow-readers valve: kernel %s cannot hold a writer at its reader's buffer: %s: use --slow-readers tcp", f.Kernel, why)
		}
	}
	_, statErr := os.Stat(cfg.PinDir)
	made := errors.Is(statErr, os.ErrNotExist)
	if err := os.MkdirAll(cfg.PinDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating pin directory: %w", err)
	}
	// The maps hold every bypassed connection's addresses: root only,
	// also for a directory made by someone else.
	if err := os.Chmod(cfg.PinDir, 0o700); err != nil {
		return nil, fmt.Errorf("restricting pin directory %s to root: %w", cfg.PinDir, err)
	}
	d, err := open(cfg, f, types)
	if err != nil {
		// A failed load leaves no directory of its own behind (only
		// an empty one is removed: what it pinned was, see create).
		if made {
			_ = os.Remove(cfg.PinDir)
		}
		return nil, err
	}
	// Every collection is loaded: the decoded kernel types (tens of MB
	// of Go memory) need not live as long as the agent.
	d.types = nil
	if d.counterNames, err = CounterNames(); err == nil {
		d.lbCounterNames, err = LBCounterNames()
	}

	if err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// loadSpec is the embedded object adapted to the kernel, its maps pinned
// by name and its settings those of want as resolved there (returned: the
// load balancer loads with the same).
func loadSpec(f *Features, want Settings) (*ebpf.CollectionSpec, Settings, error) {
	if err := want.Validate(); err != nil {
		return nil, Settings{}, err
	}
	spec, err := loadBypass()
	if err != nil {
		return nil, Settings{}, fmt.Errorf("loading embedded BPF object: %w", err)
	}
	if err := f.adapt(spec); err != nil {
		return nil, Settings{}, err
	}
	for _, m := range spec.Maps {
		if strings.HasPrefix(m.Name, "sl_") {
			m.Pinning = ebpf.PinByName
		}
	}
	loaded := want.Resolve(*f)
	if err := loaded.set(spec, bypassVarSlSettings); err != nil {
		return nil, Settings{}, err
	}
	return spec, loaded, nil
}

func create(cfg Config, f Features, types *btf.Cache) (*Datapath, error) {
	spec, loaded, err := loadSpec(&f, cfg.Settings)
	if err != nil {
		return nil, err
	}
	d := &Datapath{cfg: cfg, features: f, types: types}
	if d.layout, err = layoutOf(spec, bypassVarSlSettings); err != nil {
		return nil, err
	}
	before, err := pinNames(cfg.PinDir)
	if err != nil {
		return nil, err
	}
	if err := spec.LoadAndAssign(&d.objs, d.loadOptions()); err != nil {
		// The maps created before the failure are pinned already.
		if uerr := unpinNew(cfg.PinDir, before); uerr != nil {
			err = errors.Join(err, uerr)
		}
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("loading datapath (verifier rejected it, the kernel lacks a needed feature): %+v", ve)
		}
		return nil, fmt.Errorf("loading datapath: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = removeOwn(d.cfg.PinDir)
			d.Close()
		}
	}()
	if err := d.recordLayout(); err != nil {
		return nil, err
	}
	d.recordBugs()
	if err := d.createLB(loaded); err != nil {
		return nil, err
	}
	if err := d.createPorts(); err != nil {
		return nil, err
	}
	// sl_msg runs on both socket maps: the valve's and the plain one
	// (every connection under --reader-verdict late or --slow-readers
	// tcp).
	attaches := []sockmapAttach{
		{bypassMapSlSockmap, d.objs.SlSockmap, d.objs.SlMsg, ebpf.AttachSkMsgVerdict},
		{bypassMapSlSockmapPlain, d.objs.SlSockmapPlain, d.objs.SlMsg, ebpf.AttachSkMsgVerdict},
	}
	// The valve's verdict: TCP's bytes join the redirected ones. The map
	// holds the attachment, as it holds sl_msg's. sl_sockmap_late holds
	// readers given it late (--reader-verdict late).
	if loaded.BacklogValve.On() {
		attaches = append(attaches,
			sockmapAttach{bypassMapSlSockmap, d.objs.SlSockmap, d.objs.SlSkb, ebpf.AttachSkSKBStreamVerdict},
			sockmapAttach{bypassMapSlSockmapLate, d.objs.SlSockmapLate, d.objs.SlSkb, ebpf.AttachSkSKBStreamVerdict})
	}
	for _, a := range attaches {
		if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: a.m.FD(), Program: a.prog, Attach: a.attach}); err != nil {
			return nil, fmt.Errorf("attaching %v to %s: %w", a.attach, a.name, err)
		}
	}
	if loaded.BacklogValve.On() && loaded.LateVerdict.On() {
		if err := d.armLate(); err != nil {
			return nil, err
		}
	}
	if err := d.objs.SlSockops.Pin(filepath.Join(cfg.PinDir, progPinSockops)); err != nil {
		return nil, fmt.Errorf("pinning sl_sockops: %w", err)
	}
	if err := d.objs.SlRelease.Pin(filepath.Join(cfg.PinDir, progPinRelease)); err != nil {
		return nil, fmt.Errorf("pinning sl_release: %w", err)
	}
	if err := d.objs.SlReclaim.Pin(filepath.Join(cfg.PinDir, progPinReclaim)); err != nil {
		return nil, fmt.Errorf("pinning sl_reclaim: %w", err)
	}
	if err := d.objs.SlSeedListener.Pin(filepath.Join(cfg.PinDir, progPinSeed)); err != nil {
		return nil, fmt.Errorf("pinning sl_seed_listener: %w", err)
	}
	// Pinned last: its presence marks a complete datapath.
	if err := d.objs.SlMsg.Pin(filepath.Join(cfg.PinDir, progPinMsg)); err != nil {
		return nil, fmt.Errorf("pinning sl_msg: %w", err)
	}
	ok = true
	return d, nil
}

func adopt(cfg Config, f Features, types *btf.Cache) (*Datapath, error) {
	if err := checkLayout(cfg.PinDir); err != nil {
		return nil, err
	}
	// Only the pinned maps are taken from the spec: the programs, and
	// the settings they were loaded with, are the running ones.
	spec, _, err := loadSpec(&f, cfg.Settings)
	if err != nil {
		return nil, err
	}
	d := &Datapath{cfg: cfg, adopted: true, features: f, types: types}
	if d.layout, err = layoutOf(spec, bypassVarSlSettings); err != nil {
		return nil, err
	}
	// Maps are reused from their pins by LoadAndAssign; programs are the
	// pinned ones, so live sockets and attachments keep what they run.
	mapsOnly := struct{ bypassMaps }{}
	if err := spec.LoadAndAssign(&mapsOnly, d.loadOptions()); err != nil {
		return nil, fmt.Errorf("adopting pinned maps in %s: %w: %w", cfg.PinDir, ErrIncompatible, err)
	}
	d.objs.bypassMaps = mapsOnly.bypassMaps
	d.readBugs()
	if d.objs.SlSockops, err = ebpf.LoadPinnedProgram(filepath.Join(cfg.PinDir, progPinSockops), nil); err != nil {
		d.Close()
		return nil, fmt.Errorf("adopting pinned sl_sockops: %w", err)
	}
	if d.objs.SlMsg, err = ebpf.LoadPinnedProgram(filepath.Join(cfg.PinDir, progPinMsg), nil); err != nil {
		d.Close()
		return nil, fmt.Errorf("adopting pinned sl_msg: %w", err)
	}
	if d.objs.SlRelease, err = ebpf.LoadPinnedProgram(filepath.Join(cfg.PinDir, progPinRelease), nil); err != nil {
		d.Close()
		return nil, fmt.Errorf("adopting pinned sl_release: %w: %w", ErrIncompatible, err)
	}
	if d.objs.SlReclaim, err = ebpf.LoadPinnedProgram(filepath.Join(cfg.PinDir, progPinReclaim), nil); err != nil {
		d.Close()
		return nil, fmt.Errorf("adopting pinned sl_reclaim: %w", err)
	}
	if d.objs.SlSeedListener, err = ebpf.LoadPinnedProgram(filepath.Join(cfg.PinDir, progPinSeed), nil); err != nil {
		d.Close()
		return nil, fmt.Errorf("adopting pinned sl_seed_listener: %w", err)
	}
	if err := d.adoptLB(); err != nil {
		d.Close()
		return nil, err
	}
	if err := d.adoptPorts(); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// SlotsEverUsed is how many distinct connection slots have been taken
// since the datapath was created (fresh slots are taken first, in order).
func (d *Datapath) SlotsEverUsed() (int, error) {
	var n uint64
	if err := d.objs.SlConnNext.Lookup(uint32(0), &n); err != nil {
		return 0, fmt.Errorf("reading the connection slot counter: %w", err)
	}
	return int(min(n, uint64(d.objs.SlConns.MaxEntries()))), nil
}

// SpendFreshSlots moves the fresh-slot counter to its end: from then on
// connections take only freed slots, the one freed longest ago first, as
// on a node that has tracked ConnSlots connections. Tests use it to reach
// slot reuse without that many connections.
func (d *Datapath) SpendFreshSlots() error {
	if err := d.objs.SlConnNext.Update(uint32(0), uint64(d.objs.SlConns.MaxEntries()), ebpf.UpdateExist); err != nil {
		return fmt.Errorf("moving the fresh-slot counter to its end: %w", err)
	}
	return nil
}

// ConnSlots is how many connections the datapath can track at once.
func (d *Datapath) ConnSlots() int { return int(d.objs.SlConns.MaxEntries()) }

// Adopted reports whether Open found the datapath already pinned.
func (d *Datapath) Adopted() bool { return d.adopted }

// PinDir is the directory of the pinned objects.
func (d *Datapath) PinDir() string { return d.cfg.PinDir }

// Close releases this process's handles; pinned objects stay.
func (d *Datapath) Close() error {
	// Generated Close methods skip objects never loaded (nil).
	return errors.Join(d.objs.Close(), d.lb.Close(), d.pt.Close())
}

// tcpRmemMax is TCP's largest receive buffer, the default backlog limit.
func tcpRmemMax() uint32 {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_rmem")
	if err == nil {
		f := strings.Fields(string(b))
		if len(f) == 3 {
			if v, err := strconv.ParseUint(f[2], 10, 32); err == nil && v > 0 {
				return uint32(v)
			}
		}
	}
	return uint32(bypassSlDefaultsSL_DEFAULT_BACKLOG_LIMIT)
}

// Programs returns the datapath's programs (for their kernel statistics).
func (d *Datapath) Programs() []*ebpf.Program {
	out := []*ebpf.Program{d.objs.SlSockops, d.objs.SlMsg, d.objs.SlRelease}
	// The valve's verdict is held by sl_sockmap, not pinned: a datapath
	// that adopted the pins has none to read.
	if d.objs.SlSkb != nil {
		out = append(out, d.objs.SlSkb)
	}
	for _, p := range d.lbPrograms() {
		if *p != nil {
			out = append(out, *p)
		}
	}
	for _, p := range d.portPrograms() {
		if *p != nil {
			out = append(out, *p)
		}
	}
	return out
}

// armLate sets the callback of the timers that give readers the valve's
// verdict late (sl_late_arm, a tc program: the callback runs with its
// rights, which include adding a socket to a socket map).
func (d *Datapath) armLate() error {
	for i := range uint32(bypassSlLateSL_LATE_TIMERS) {
		// struct __sk_buff up to its mark (len and pkt_type stay 0):
		// the timer's index.
		ctx := [3]uint32{0, 0, i}
		ret, err := d.objs.SlLateArm.Run(&ebpf.RunOptions{Data: make([]byte, 64), Context: ctx})
		if err != nil {
			return fmt.Errorf("arming the late verdict's timer %d (--reader-verdict late; --reader-verdict join does without them): %w", i, err)
		}
		if ret != 0 {
			return fmt.Errorf("arming the late verdict's timer %d: sl_late_arm returned %d (1: no timer, 2: bpf_timer_init failed, 3: bpf_timer_set_callback failed; --reader-verdict join does without them)", i, ret)
		}
	}
	return nil
}

// sockmapAttach is a program a socket map carries: each socket that joins
// the map takes it.
type sockmapAttach struct {
	name   string
	m      *ebpf.Map
	prog   *ebpf.Program
	attach ebpf.AttachType
}
