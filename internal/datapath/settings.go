package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/sockbugs"
)

// Settings are a datapath's load-time settings: the const volatile
// globals of bypass.c, fixed when its programs load.
type Settings struct {
	// Bypass: connections between managed sockets are bypassed (else
	// all stay on TCP).
	Bypass bool `json:"bypass"`
	// BacklogLimit in bytes (Config.BacklogLimit, 0 resolved).
	BacklogLimit   uint32 `json:"backlog_limit"`
	VerdictWindow  uint32 `json:"verdict_window"`
	BypassBlocking bool   `json:"bypass_blocking"`
	BypassBrief    bool   `json:"bypass_brief"`
}

// Mode is a setting that is on, off, or decided by what the kernel's
// sockmap gets wrong (ModeAuto, the zero value).
type Mode uint8

const (
	ModeAuto Mode = iota
	ModeOn
	ModeOff
)

// resolve is m, or for ModeAuto whether the kernel is fit. A kernel
// whose bugs could not be probed counts as having them.
func (m Mode) resolve(f Features, fit bool) bool {
	switch m {
	case ModeOn:
		return true
	case ModeOff:
		return false
	}
	return f.BugsError == "" && fit
}

// Settings returns what a datapath loaded with cfg gets on a kernel with
// features f (and the sockmap bugs found there). Bypass auto needs
// FIONREAD to count redirected bytes, sk_psock to count queued ones (the
// backlog rule, the bypass's only backpressure), and epoll wake-ups and
// FINs that work: the bugs that break programs socklane cannot tell apart.
func (cfg Config) Settings(f Features) Settings {
	s := Settings{
		Bypass: cfg.Bypass.resolve(f, f.PsockMsgTotLen && !f.Has(sockbugs.FIONREAD) &&
			!f.Has(sockbugs.EpollWakeup) && !f.Has(sockbugs.FINLost)),
		BacklogLimit:   cfg.BacklogLimit,
		VerdictWindow:  cfg.VerdictWindow,
		BypassBlocking: cfg.BypassBlocking.resolve(f, !f.Has(sockbugs.BlockingEAGAIN)),
		BypassBrief:    cfg.BypassBrief,
	}
	if s.BacklogLimit == 0 {
		s.BacklogLimit = tcpRmemMax()
	}
	return s
}

// globals are the settings as bypass.c holds them: blocking_tcp and
// brief_learn are the negations of the bypass modes.
type globals struct {
	bypass, backlogLimit, verdictWindow, blockingTCP, briefLearn uint32
}

func (s Settings) globals() globals {
	return globals{boolWord(s.Bypass), s.BacklogLimit, s.VerdictWindow, boolWord(!s.BypassBlocking), boolWord(!s.BypassBrief)}
}

func (g globals) settings() Settings {
	return Settings{Bypass: g.bypass != 0, BacklogLimit: g.backlogLimit, VerdictWindow: g.verdictWindow, BypassBlocking: g.blockingTCP == 0, BypassBrief: g.briefLearn == 0}
}

// fields pairs each global's variable spec with its value in g.
func (g *globals) fields(vs *bypassVariableSpecs) []struct {
	spec *ebpf.VariableSpec
	v    *uint32
} {
	return []struct {
		spec *ebpf.VariableSpec
		v    *uint32
	}{
		{vs.Bypass, &g.bypass},
		{vs.BacklogLimit, &g.backlogLimit},
		{vs.VerdictWindow, &g.verdictWindow},
		{vs.BlockingTcp, &g.blockingTCP},
		{vs.BriefLearn, &g.briefLearn},
	}
}

func boolWord(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// set writes s into the globals of spec.
func (s Settings) set(spec *ebpf.CollectionSpec) error {
	l, err := layoutOf(spec)
	if err != nil {
		return err
	}
	g := s.globals()
	for _, f := range g.fields(&l.vars) {
		if err := f.spec.Set(*f.v); err != nil {
			return fmt.Errorf("setting %s: %w", f.spec.Name, err)
		}
	}
	return nil
}

// settingsLayout is where the settings' globals live: their variable
// specs (offsets and sizes) and the read-only data map holding them.
type settingsLayout struct {
	vars   bypassVariableSpecs
	rodata *ebpf.MapSpec
}

func layoutOf(spec *ebpf.CollectionSpec) (settingsLayout, error) {
	var l settingsLayout
	if err := spec.Assign(&l.vars); err != nil {
		return l, fmt.Errorf("finding the datapath's settings: %w", err)
	}
	l.rodata = spec.Maps[l.vars.VerdictWindow.SectionName]
	return l, nil
}

// Settings reads the settings the running datapath was loaded with, from
// the read-only data of its sl_msg program (an adopted datapath may have
// been loaded by another command with other flags).
func (d *Datapath) Settings() (Settings, error) {
	data, err := d.rodata(d.layout.rodata)
	if err != nil {
		return Settings{}, err
	}
	var g globals
	for _, f := range g.fields(&d.layout.vars) {
		end := int(f.spec.Offset) + 4
		if f.spec.Size() != 4 || end > len(data) {
			return Settings{}, fmt.Errorf("reading %s: not a 4-byte global inside %d bytes of read-only data", f.spec.Name, len(data))
		}
		*f.v = binary.NativeEndian.Uint32(data[f.spec.Offset:end])
	}
	return g.settings(), nil
}

// rodata finds the read-only data map sl_msg runs with (the one shaped
// like want) and returns its contents.
func (d *Datapath) rodata(want *ebpf.MapSpec) ([]byte, error) {
	if want == nil {
		return nil, errors.New("the datapath object has no read-only data")
	}
	info, err := d.objs.SlMsg.Info()
	if err != nil {
		return nil, fmt.Errorf("reading sl_msg's info: %w", err)
	}
	ids, ok := info.MapIDs()
	if !ok {
		return nil, errors.New("the kernel does not list a program's maps")
	}
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue
		}
		mi, err := m.Info()
		if err != nil || mi.Type != ebpf.Array || mi.ValueSize != want.ValueSize || mi.MaxEntries != 1 || mi.Name != want.Name {
			m.Close()
			continue
		}
		data := make([]byte, mi.ValueSize)
		err = m.Lookup(uint32(0), &data)
		m.Close()
		if err != nil {
			return nil, fmt.Errorf("reading sl_msg's read-only data: %w", err)
		}
		return data, nil
	}
	return nil, errors.New("sl_msg runs without the read-only data its settings live in")
}
