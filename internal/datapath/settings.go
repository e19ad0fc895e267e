package datapath

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/sockbugs"
)

// Settings are a datapath's load-time settings: struct sl_config
// (sl_structs.h) as bpf2go generates it, the one const volatile of
// bypass.c. The same value carries a request from flag parsing (Flags) to
// the loader, which resolves what is left to the kernel (Resolve) and
// writes it into the programs' read-only data, and comes back from there
// (Datapath.Settings) to be compared field by field (Differs).
type Settings = bypassSlConfig

// Mode is a setting that is on, off, or decided by what the kernel's
// sockmap gets wrong (ModeAuto, the zero value): enum sl_mode.
type Mode = bypassSlMode

// The modes.
const (
	ModeAuto = bypassSlModeSL_MODE_AUTO
	ModeOn   = bypassSlModeSL_MODE_ON
	ModeOff  = bypassSlModeSL_MODE_OFF
	// ModeProcess: blocking-sockets decided per process (the
	// datapath reads the process's signal handlers).
	ModeProcess = bypassSlModeSL_MODE_PROCESS
)

// Verdict window bounds (enum sl_defaults).
const (
	DefaultVerdictWindow = uint32(bypassSlDefaultsSL_DEFAULT_VERDICT_WINDOW)
	MaxVerdictWindow     = uint32(bypassSlDefaultsSL_MAX_VERDICT_WINDOW)
	// WindowSends is how many sends of its size a small send's verdict
	// window holds at most (enum sl_window).
	WindowSends = uint32(bypassSlWindowSL_WINDOW_SENDS)
)

// SmallWindow is the verdict window a send of size bytes under the verdict
// window w opens (sl_verdict.h's small_window): WindowSends sends of its
// size, at most w bytes.
func SmallWindow(size, w uint32) uint32 {
	return uint32(min(uint64(size)*uint64(WindowSends), uint64(w)))
}

// Default owner quotas and their bounds (enum sl_quota): the tables'
// sizes.
const (
	DefaultOwnerConns       = uint32(bypassSlQuotaSL_OWNER_CONNS)
	DefaultOwnerListeners   = uint32(bypassSlQuotaSL_OWNER_LISTENERS)
	DefaultOwnerLBConns     = uint32(bypassSlQuotaSL_OWNER_LB_CONNS)
	DefaultOwnerAffinity    = uint32(bypassSlQuotaSL_OWNER_AFFINITY)
	DefaultOwnerUDPTables   = uint32(bypassSlQuotaSL_OWNER_UDP_TABLES)
	DefaultOwnerEvictTimers = uint32(bypassSlQuotaSL_OWNER_EVICT_TIMERS)
	DefaultOwnerMsgs        = uint32(bypassSlQuotaSL_OWNER_MSGS)
)

// DefaultSettings are what a load asks for when nothing is given: the
// bypass and blocking readers left to the kernel's bugs, slow readers
// pushed back through TCP by the valve where the kernel runs it
// (Features.ValveFit) and moved to TCP by the backlog rule elsewhere,
// readers given the valve's verdict as they join, the backlog
// limit to net.ipv4.tcp_rmem, the default verdict window and owner
// quotas, brief connections learnt and left on TCP.
func DefaultSettings() Settings {
	return Settings{Bypass: ModeAuto, VerdictWindow: DefaultVerdictWindow, BypassBlocking: ModeAuto, BypassBrief: ModeOff,
		BypassSmallStreams: ModeOff, BacklogValve: ModeAuto, LateVerdict: ModeOff, OwnerConns: DefaultOwnerConns, OwnerListeners: DefaultOwnerListeners, OwnerLbConns: DefaultOwnerLBConns,
		OwnerAffinity: DefaultOwnerAffinity, OwnerUdpTables: DefaultOwnerUDPTables, OwnerEvictTimers: DefaultOwnerEvictTimers, OwnerMsgs: DefaultOwnerMsgs, LbHostOnly: ModeOff}
}

// Quotas are what one owner may hold under s.
func (s Settings) Quotas() Quotas {
	return Quotas{Conns: uint64(s.OwnerConns), Listeners: uint64(s.OwnerListeners), LBConns: uint64(s.OwnerLbConns),
		Affinity: uint64(s.OwnerAffinity), UDPTables: uint64(s.OwnerUdpTables), EvictTimers: uint64(s.OwnerEvictTimers), Msgs: uint64(s.OwnerMsgs)}
}

// On reports whether a resolved mode is on.
func (m Mode) On() bool { return m == ModeOn }

// resolve is m, or for ModeAuto whether the kernel is fit. A kernel
// whose bugs could not be probed counts as having them.
func (m Mode) resolve(f Features, fit bool) Mode {
	if m == ModeAuto {
		if f.BugsError == "" && fit {
			return ModeOn
		}
		return ModeOff
	}
	return m
}

// Resolve is what a datapath loaded with the request s gets on a kernel
// with features f (and the sockmap bugs found there). Bypass auto needs
// FIONREAD to count redirected bytes, sk_psock to count queued ones (the
// backlog rule, the bypass's only backpressure), and epoll wake-ups and
// FINs that work: the bugs that break programs socklane cannot tell apart.
func (s Settings) Resolve(f Features) Settings {
	s.Bypass = s.Bypass.resolve(f, f.PsockMsgTotLen && !f.Has(sockbugs.FIONREAD) &&
		!f.Has(sockbugs.EpollWakeup) && !f.Has(sockbugs.FINLost))
	// A kernel with the interrupted-read bug (or not probed) decides
	// blocking readers per process: only those whose process handles a
	// signal that can interrupt their read stay on TCP.
	if s.BypassBlocking == ModeAuto && (f.BugsError != "" || f.Has(sockbugs.BlockingEAGAIN)) {
		s.BypassBlocking = ModeProcess
	}
	s.BypassBlocking = s.BypassBlocking.resolve(f, true)
	if s.BypassBrief == ModeAuto {
		s.BypassBrief = ModeOff
	}
	if s.BypassSmallStreams == ModeAuto {
		s.BypassSmallStreams = ModeOff
	}
	// The valve where the kernel charges redirected bytes to their reader
	// and sk_psock counts them; elsewhere the backlog rule.
	if s.BacklogValve == ModeAuto {
		s.BacklogValve = ModeOff
		if f.ValveFit() && f.PsockMsgTotLen {
			s.BacklogValve = ModeOn
		}
	}
	// Readers take the valve's verdict as they join: the late verdict
	// does not yet serve every reader the valve does (docs/ARCHITECTURE.md,
	// readers given the verdict late).
	if s.LateVerdict == ModeAuto {
		s.LateVerdict = ModeOff
	}
	if s.BacklogLimit == 0 {
		s.BacklogLimit = tcpRmemMax()
	}
	for _, q := range []struct {
		v   *uint32
		def uint32
	}{
		{&s.OwnerConns, DefaultOwnerConns}, {&s.OwnerListeners, DefaultOwnerListeners}, {&s.OwnerLbConns, DefaultOwnerLBConns},
		{&s.OwnerAffinity, DefaultOwnerAffinity}, {&s.OwnerUdpTables, DefaultOwnerUDPTables},
		{&s.OwnerEvictTimers, DefaultOwnerEvictTimers}, {&s.OwnerMsgs, DefaultOwnerMsgs},
	} {
		if *q.v == 0 {
			*q.v = q.def
		}
	}
	if s.LbHostOnly == ModeAuto {
		s.LbHostOnly = ModeOff
	}
	s.HostNetns = f.HostNetns
	s.ListenerKptr = 0
	if f.HashKptr {
		s.ListenerKptr = 1
	}
	return s
}

// setting is one user setting: its flag, where it lives in Settings, and
// how its flag spells it.
type setting struct {
	name, usage string
	// mode is a mode setting's field, with its flag's words for each mode
	// (a mode without a word is not accepted).
	mode  func(*Settings) *Mode
	words map[Mode]string
	// num is a number's field, counting unit, at most max (0: any).
	num  func(*Settings) *uint32
	unit string
	max  uint32
}

// settingTable lists the user settings in flag order.
func settingTable() []setting {
	return []setting{
		{name: "bypass", mode: func(s *Settings) *Mode { return &s.Bypass }, words: map[Mode]string{ModeAuto: "auto", ModeOn: "on", ModeOff: "off"},
			usage: "bypass connections between managed sockets: on, off (all stay on TCP; services, events and metrics still work), or auto (off where the kernel's FIONREAD answers 0 for redirected bytes, which hangs programs that size their reads by it, or where its sockmap loses wake-ups or FINs; found by behaviour at load)"},
		{name: "backlog-limit", num: func(s *Settings) *uint32 { return &s.BacklogLimit }, unit: "bytes",
			usage: "receiver backlog in bytes (at least the receiver's SO_RCVBUF) above which, for about 50 ms or at once above twice it, a bypassed direction moves to TCP; also the receiver's budget of queued messages, one per KiB (each redirected send pins a KiB of kernel memory until read): held, the valve opens or the direction moves likewise (0: net.ipv4.tcp_rmem max)"},
		{name: "blocking-sockets", mode: func(s *Settings) *Mode { return &s.BypassBlocking }, words: map[Mode]string{ModeAuto: "auto", ModeOn: "bypass", ModeOff: "tcp", ModeProcess: "per-process"},
			usage: "connections with an end reading in blocking mode: tcp, bypass, per-process (on TCP only if the end's process handles a signal that can interrupt a read while it runs normally: SIGUSR1/2, SIGALRM, SIGCHLD, timers, job control, real-time signals...; read at connect(), listen() and the first send), or auto (per-process where the kernel's sockmap turns a blocking read interrupted by a signal into EAGAIN, found by behaviour at load; bypass elsewhere)"},
		{name: "brief-connections", mode: func(s *Settings) *Mode { return &s.BypassBrief }, words: map[Mode]string{ModeOn: "bypass", ModeOff: "tcp"},
			usage: "connections to a destination whose last few connections from the same network namespace were brief (one send each way, then close): tcp (cheaper for them; one in 16 still joins the bypass to keep learning) or bypass"},
		{name: "small-streams", mode: func(s *Settings) *Mode { return &s.BypassSmallStreams }, words: map[Mode]string{ModeOn: "bypass", ModeOff: "tcp"},
			usage: "a bypassed direction streaming sends under 128 bytes one way, fast (4 verdict windows of up to 64 sends used up with nothing sent back, each at sends about 8 us apart or closer): tcp (moved to TCP, which coalesces the writes, unless the writer set TCP_NODELAY; request/response traffic and slower streams keep the bypass) or bypass"},
		{name: "slow-readers", mode: func(s *Settings) *Mode { return &s.BacklogValve }, words: map[Mode]string{ModeAuto: "auto", ModeOn: "valve", ModeOff: "tcp"},
			usage: "a bypassed direction whose reader falls behind: valve (its writer's sends pass to TCP, whose window paces it, while the reader's queue is near its SO_RCVBUF, less the window its TCP offered (half of it while TCP may still raise the buffer that much), and are redirected again once it caught up; an sk_skb verdict on the map puts TCP's bytes in the same queue, and bypassed sockets get a 16 KiB TCP_NOTSENT_LOWAT where their application set none and a TCP window of at most 64 KiB (TCP_WINDOW_CLAMP) while the valve may pass into them; only where the kernel charges redirected bytes to their reader (6.13, and stable kernels with that fix: socklane status lists redirect_uncharged otherwise); docs/ARCHITECTURE.md, known limits), tcp (moved to TCP for good by the backlog rule, --backlog-limit), or auto (valve where the kernel runs it, tcp elsewhere)"},
		{name: "reader-verdict", mode: func(s *Settings) *Mode { return &s.LateVerdict }, words: map[Mode]string{ModeOn: "late", ModeOff: "join"},
			usage: "with the valve (--slow-readers valve): join (every connection's sockets take the valve's sk_skb verdict as they join the bypass, so every read takes the kernel's parser receive path), late (they join without it, reads on the plain receive path as the bare redirect's, and a reader gets it from the kernel when its writer first finds 64 KiB queued for it, through a timer whose callback a tc program set at load; until then, or if it cannot be given, the backlog rule; a reader that half-closed its own side cannot be given it)"},
		{name: "service-lb-scope", mode: func(s *Settings) *Mode { return &s.LbHostOnly }, words: map[Mode]string{ModeOff: "all", ModeOn: "host"},
			usage: "sockets whose connects to service addresses are balanced at connect(): all (every managed socket, but pods opted out) or host (the host's network namespace only: pods' service traffic is left to kube-proxy, as a service mesh's sidecars need)"},
		{name: "verdict-window", num: func(s *Settings) *uint32 { return &s.VerdictWindow }, unit: "bytes", max: MaxVerdictWindow,
			usage: "sends smaller than this many bytes redirect under one verdict for the next this-many bytes (or 64 sends of their size, if fewer), within half the receiver's budget of messages (--backlog-limit); larger ones under 256 KiB open one of 256 KiB only where that budget allows (not at the default limit) (0: a verdict per send)"},
		{name: "owner-conns", num: func(s *Settings) *uint32 { return &s.OwnerConns }, unit: "entries", max: uint32(bypassSlQuotaSL_QUOTA_MAX_CONNS),
			usage: "bypass connection slots one cgroup (a pod's container) may hold; its further connections stay on TCP (0: the default)"},
		{name: "owner-listeners", num: func(s *Settings) *uint32 { return &s.OwnerListeners }, unit: "entries", max: uint32(bypassSlQuotaSL_QUOTA_MAX_LISTENERS),
			usage: "listening sockets one cgroup may have learned; connections to its further listeners stay on TCP (0: the default)"},
		{name: "owner-lb-conns", num: func(s *Settings) *uint32 { return &s.OwnerLbConns }, unit: "entries", max: uint32(bypassSlQuotaSL_QUOTA_MAX_LB_CONNS),
			usage: "connected sockets to service addresses one cgroup may have recorded for destruction when their backend goes (0: the default)"},
		{name: "owner-affinity", num: func(s *Settings) *uint32 { return &s.OwnerAffinity }, unit: "entries", max: uint32(bypassSlQuotaSL_QUOTA_MAX_AFFINITY),
			usage: "ClientIP affinity entries (client network namespace, service port) one cgroup may have made; beyond it its connects are balanced without affinity (0: the default)"},
		{name: "owner-udp-tables", num: func(s *Settings) *uint32 { return &s.OwnerUdpTables }, unit: "tables", max: uint32(bypassSlQuotaSL_QUOTA_MAX_UDP_TABLES),
			usage: "exchange tables one cgroup's unconnected UDP sockets may hold under network policy (3 KiB each, made at a socket's first send from an isolated pod; a socket's overflow table counts two); beyond it the exchanges of its further sockets are not recorded and answers to them are judged as new flows (0: the default)"},
		{name: "owner-evict-timers", num: func(s *Settings) *uint32 { return &s.OwnerEvictTimers }, unit: "timers", max: uint32(bypassSlQuotaSL_QUOTA_MAX_EVICT_TIMERS),
			usage: "timers one cgroup's connections may have waiting for a socket to leave the bypass after a move to TCP (each checks up to 1,000 times a second, in the kernel, charged to no process); beyond it such a socket is checked at its own transmits only (0: the default)"},
		{name: "owner-messages", num: func(s *Settings) *uint32 { return &s.OwnerMsgs }, unit: "messages", max: uint32(bypassSlQuotaSL_QUOTA_MAX_MSGS),
			usage: fmt.Sprintf("messages one cgroup's connections may hold in their readers' queues together (each redirected send is one until read: a KiB of kernel memory charged to no cgroup; --backlog-limit bounds one connection's); beyond it a send goes without a verdict window, and one whose direction holds %d or more opens the valve or moves to TCP (0: the default)", bypassSlMsgQuotaSL_MSG_LIGHT)},
	}
}

// SettingNames lists the settings' flag names.
func SettingNames() []string {
	var out []string
	for _, st := range settingTable() {
		out = append(out, st.name)
	}
	return out
}

// format spells st's value in s as its flag does.
func (st setting) format(s *Settings) string {
	if st.mode != nil {
		if w, ok := st.words[*st.mode(s)]; ok {
			return w
		}
		return fmt.Sprintf("mode(%d)", *st.mode(s))
	}
	return strconv.FormatUint(uint64(*st.num(s)), 10)
}

// spelling lists the words st's flag takes.
func (st setting) spelling() string {
	var ws []string
	for _, m := range []Mode{ModeAuto, ModeOn, ModeOff, ModeProcess} {
		if w, ok := st.words[m]; ok {
			ws = append(ws, w)
		}
	}
	return strings.Join(ws, ", ")
}

// parse sets st in s from its flag's value.
func (st setting) parse(s *Settings, v string) error {
	if st.mode != nil {
		for m, w := range st.words {
			if w == v {
				*st.mode(s) = m
				return nil
			}
		}
		return fmt.Errorf("want one of %s", st.spelling())
	}
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil {
		return fmt.Errorf("want a number of %s", st.unit)
	}
	*st.num(s) = uint32(n)
	return st.check(s)
}

// check reports a value of st in s that cannot load (ModeAuto always
// can: Resolve decides it).
func (st setting) check(s *Settings) error {
	if st.mode != nil {
		if _, ok := st.words[*st.mode(s)]; !ok && *st.mode(s) != ModeAuto {
			return fmt.Errorf("mode %d: want one of %s", *st.mode(s), st.spelling())
		}
		return nil
	}
	if n := *st.num(s); st.max != 0 && n > st.max {
		return fmt.Errorf("want at most %d %s", st.max, st.unit)
	}
	return nil
}

// Validate checks every setting of a request.
func (s Settings) Validate() error {
	for _, st := range settingTable() {
		if err := st.check(&s); err != nil {
			return fmt.Errorf("--%s %s: %w", st.name, st.format(&s), err)
		}
	}
	return nil
}

// SettingFlag is one setting of a Settings as a command-line flag: a
// pflag.Value that parses into the field and prints it.
type SettingFlag struct {
	Name, Usage string
	st          setting
	s           *Settings
}

func (f SettingFlag) String() string     { return f.st.format(f.s) }
func (f SettingFlag) Set(v string) error { return f.st.parse(f.s, v) }
func (f SettingFlag) Type() string {
	if f.st.mode != nil {
		return "mode"
	}
	return f.st.unit
}

// Flags are s's settings as flags, bound to s.
func (s *Settings) Flags() []SettingFlag {
	var out []SettingFlag
	for _, st := range settingTable() {
		out = append(out, SettingFlag{Name: st.name, Usage: st.usage, st: st, s: s})
	}
	return out
}

// SettingDiff is a setting that differs between two Settings.
type SettingDiff struct{ Name, Have, Want string }

// Differs returns the first setting among given (flag names) on which s
// and want differ.
func (s Settings) Differs(want Settings, given []string) (SettingDiff, bool) {
	for _, st := range settingTable() {
		for _, g := range given {
			if g == st.name && st.format(&s) != st.format(&want) {
				return SettingDiff{Name: st.name, Have: st.format(&s), Want: st.format(&want)}, true
			}
		}
	}
	return SettingDiff{}, false
}

// MarshalJSON writes the user settings keyed by flag name, as the flags
// spell them (numbers as numbers).
func (s Settings) MarshalJSON() ([]byte, error) {
	out := map[string]any{}
	for _, st := range settingTable() {
		if st.mode != nil {
			out[st.name] = st.format(&s)
		} else {
			out[st.name] = *st.num(&s)
		}
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads what MarshalJSON wrote; a setting left out keeps
// its value.
func (s *Settings) UnmarshalJSON(b []byte) error {
	var in map[string]json.RawMessage
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	for _, st := range settingTable() {
		raw, ok := in[st.name]
		if !ok {
			continue
		}
		var v string
		if st.mode != nil {
			if err := json.Unmarshal(raw, &v); err != nil {
				return fmt.Errorf("setting %s: %w", st.name, err)
			}
		} else {
			v = string(raw)
		}
		if err := st.parse(s, v); err != nil {
			return fmt.Errorf("setting %s %s: %w", st.name, raw, err)
		}
	}
	return nil
}

// set writes s into the settings global name of spec.
func (s Settings) set(spec *ebpf.CollectionSpec, name string) error {
	v, ok := spec.Variables[name]
	if !ok {
		return fmt.Errorf("the datapath object has no %s", name)
	}
	if err := v.Set(s); err != nil {
		return fmt.Errorf("setting %s: %w", name, err)
	}
	return nil
}

// settingsLayout is where the settings live: their variable spec (offset
// and size) and the read-only data map holding them.
type settingsLayout struct {
	v      *ebpf.VariableSpec
	rodata *ebpf.MapSpec
}

func layoutOf(spec *ebpf.CollectionSpec, name string) (settingsLayout, error) {
	v, ok := spec.Variables[name]
	if !ok {
		return settingsLayout{}, fmt.Errorf("finding the datapath's settings: no %s", name)
	}
	return settingsLayout{v: v, rodata: spec.Maps[v.SectionName]}, nil
}

// Settings reads the settings the running datapath was loaded with, from
// the read-only data of its sl_msg program (an adopted datapath may have
// been loaded by another command with other flags).
func (d *Datapath) Settings() (Settings, error) { return settingsOf(d.objs.SlMsg, d.layout) }

// lbSettings reads the settings the load balancer's programs run with
// (connect4's read-only data).
func (d *Datapath) lbSettings() (Settings, error) {
	spec, err := loadServicelb()
	if err != nil {
		return Settings{}, fmt.Errorf("loading embedded service load balancer object: %w", err)
	}
	l, err := layoutOf(spec, servicelbVarSlSettings)
	if err != nil {
		return Settings{}, err
	}
	return settingsOf(d.lb.SlConnect4, l)
}

// settingsOf decodes the settings prog runs with from the read-only data
// map shaped as l says.
func settingsOf(prog *ebpf.Program, l settingsLayout) (Settings, error) {
	data, err := rodata(prog, l.rodata)
	if err != nil {
		return Settings{}, err
	}
	var s Settings
	v := l.v
	end := int(v.Offset) + int(v.Size())
	if int(v.Size()) != binary.Size(s) || end > len(data) {
		return Settings{}, fmt.Errorf("reading %s: not a %d-byte struct inside %d bytes of read-only data", v.Name, binary.Size(s), len(data))
	}
	if _, err := binary.Decode(data[v.Offset:end], binary.NativeEndian, &s); err != nil {
		return Settings{}, fmt.Errorf("decoding %s: %w", v.Name, err)
	}
	return s, nil
}

// rodata finds the read-only data map prog runs with (the one shaped like
// want) and returns its contents.
func rodata(prog *ebpf.Program, want *ebpf.MapSpec) ([]byte, error) {
	if want == nil {
		return nil, errors.New("the datapath object has no read-only data")
	}
	info, err := prog.Info()
	if err != nil {
		return nil, fmt.Errorf("reading %s's info: %w", prog, err)
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
			return nil, fmt.Errorf("reading %s's read-only data: %w", prog, err)
		}
		return data, nil
	}
	return nil, fmt.Errorf("%s runs without the read-only data its settings live in", prog)
}
