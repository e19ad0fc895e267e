package datapath

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/socklane/socklane/internal/sockbugs"
	"github.com/socklane/socklane/internal/testutil"
)

// TestSettingsReadBack loads datapaths with different settings and reads
// them back from the loaded programs, and again after adopting the pins
// with other settings asked for (adoption keeps what was loaded).
func TestSettingsReadBack(t *testing.T) {
	testutil.RequireRoot(t)
	f, err := ProbeFeatures()
	if err != nil {
		t.Fatal(err)
	}
	valveFit := f.ValveFit()
	for i, want := range []Settings{
		{Bypass: ModeOn, BacklogLimit: 1 << 20, VerdictWindow: DefaultVerdictWindow, BypassBlocking: ModeOff, BypassBrief: ModeOff,
			BypassSmallStreams: ModeOff, BacklogValve: ModeOff, LateVerdict: ModeOff, OwnerConns: DefaultOwnerConns, OwnerListeners: DefaultOwnerListeners, OwnerLbConns: DefaultOwnerLBConns, OwnerAffinity: DefaultOwnerAffinity, OwnerUdpTables: DefaultOwnerUDPTables, OwnerEvictTimers: DefaultOwnerEvictTimers, OwnerMsgs: DefaultOwnerMsgs, LbHostOnly: ModeOff},
		{Bypass: ModeOn, BacklogLimit: 123456, VerdictWindow: 0, BypassBlocking: ModeOn, BypassBrief: ModeOff,
			BypassSmallStreams: ModeOn, BacklogValve: ModeOn, LateVerdict: ModeOn, OwnerConns: 1, OwnerListeners: 2, OwnerLbConns: 3, OwnerAffinity: 4, OwnerUdpTables: 5, OwnerEvictTimers: 6, OwnerMsgs: 7, LbHostOnly: ModeOn},
		{Bypass: ModeOff, BacklogLimit: 7 << 20, VerdictWindow: 65536, BypassBlocking: ModeOff, BypassBrief: ModeOn,
			BypassSmallStreams: ModeOff, BacklogValve: ModeOff, LateVerdict: ModeOn, OwnerConns: 65536, OwnerListeners: 65536, OwnerLbConns: 131072, OwnerAffinity: 262144, OwnerUdpTables: 1048576, OwnerEvictTimers: 131072, OwnerMsgs: 16777216, LbHostOnly: ModeOff},
		{Bypass: ModeOn, BacklogLimit: 1, VerdictWindow: MaxVerdictWindow, BypassBlocking: ModeOn, BypassBrief: ModeOn,
			BypassSmallStreams: ModeOn, BacklogValve: ModeOn, LateVerdict: ModeOff, OwnerConns: 300, OwnerListeners: 20, OwnerLbConns: 4000, OwnerAffinity: 16, OwnerUdpTables: 64, OwnerEvictTimers: 1, OwnerMsgs: 4096, LbHostOnly: ModeOn},
	} {
		t.Run(fmt.Sprintf("%+v", want), func(t *testing.T) {
			dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("sltest-set-%d-%d", os.Getpid(), i))
			if want.BacklogValve.On() && !valveFit {
				// Refused by name where the kernel cannot run it, nothing pinned.
				if _, err := Open(Config{PinDir: dir, Settings: want}); err == nil || !strings.Contains(err.Error(), "--slow-readers valve: kernel") {
					t.Fatalf("the valve on kernel %s: %v, want refused", f.Kernel, err)
				}
				if _, err := os.Stat(dir); !os.IsNotExist(err) {
					t.Fatalf("a refused load left %s: %v", dir, err)
				}
				want.BacklogValve = ModeOff
			}
			dp := testDatapathWith(t, Config{PinDir: dir, Settings: want})
			got, err := dp.Settings()
			if err == nil {
				var lb Settings
				lb, err = dp.lbSettings()
				if err == nil && lb != got {
					t.Errorf("the load balancer loaded %+v, the bypass %+v", lb, got)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			want.ListenerKptr = got.ListenerKptr // the kernel's, checked below
			want.HostNetns = got.HostNetns       // the loader's namespace
			if got.HostNetns == 0 || got.HostNetns != dp.Features().HostNetns {
				t.Errorf("host_netns %d loaded, the prober's namespace is %d", got.HostNetns, dp.Features().HostNetns)
			}
			if got != want {
				t.Fatalf("loaded: settings %+v; want %+v", got, want)
			}
			if kptr := dp.Features().HashKptr; (got.ListenerKptr == 1) != kptr {
				t.Errorf("listener_kptr %d loaded on a kernel whose hash map kptr is %v", got.ListenerKptr, kptr)
			}
			other := Config{PinDir: dir, Settings: Settings{Bypass: ModeOn + ModeOff - want.Bypass, BacklogLimit: 99, VerdictWindow: 8,
				BypassBlocking: ModeOn + ModeOff - want.BypassBlocking, BypassBrief: ModeOn + ModeOff - want.BypassBrief,
				BypassSmallStreams: ModeOn + ModeOff - want.BypassSmallStreams, BacklogValve: ModeOff, LateVerdict: ModeOn + ModeOff - want.LateVerdict}}
			if valveFit {
				other.Settings.BacklogValve = ModeOn + ModeOff - want.BacklogValve
			}
			adopted, err := Open(other)
			if err != nil {
				t.Fatal(err)
			}
			defer adopted.Close()
			if !adopted.Adopted() {
				t.Fatal("second Open did not adopt the pinned datapath")
			}
			if got, err := adopted.Settings(); err != nil || got != want {
				t.Errorf("adopted: settings %+v, %v; want the loaded %+v", got, err, want)
			}
			if d, ok := want.Differs(other.Settings.Resolve(adopted.Features()), SettingNames()); !ok || d.Name != "bypass" {
				t.Errorf("Differs of every setting: %+v %v, want bypass first", d, ok)
			}
		})
	}
}

// TestResolve checks what a request resolves to: a zero backlog limit is
// tcp_rmem's maximum, and the modes left to the kernel follow the bugs
// found (none probed counts as all found).
func TestResolve(t *testing.T) {
	fit := Features{PsockMsgTotLen: true, CastKernCtx: true}
	if got := DefaultSettings().Resolve(fit).BacklogLimit; got != tcpRmemMax() || got == 0 {
		t.Errorf("backlog limit of the defaults: %d, want tcp_rmem max %d", got, tcpRmemMax())
	}
	if got := (Settings{BacklogLimit: 5}).Resolve(fit).BacklogLimit; got != 5 {
		t.Errorf("backlog limit 5 read as %d", got)
	}
	// Slow readers left to the datapath: the valve where sk_psock counts
	// queued bytes and the kernel charges redirected ones to their reader,
	// the one-way move elsewhere.
	uncharged := Features{PsockMsgTotLen: true, CastKernCtx: true, Bugs: []sockbugs.Bug{sockbugs.Describe(sockbugs.Uncharged)}}
	for _, tt := range []struct {
		s    Settings
		f    Features
		want Mode
	}{
		{Settings{}, fit, ModeOn},
		{Settings{}, Features{Kernel: "6.12.117+deb12-cloud-amd64", PsockMsgTotLen: true, CastKernCtx: true}, ModeOn},
		{Settings{}, Features{PsockMsgTotLen: true}, ModeOff},
		{Settings{}, uncharged, ModeOff},
		{Settings{}, Features{Kernel: "6.18.44"}, ModeOff},
		{Settings{}, Features{PsockMsgTotLen: true, CastKernCtx: true, BugsError: "no namespace"}, ModeOff},
		{Settings{BacklogValve: ModeOff}, fit, ModeOff},
		{Settings{BacklogValve: ModeOn}, fit, ModeOn},
		// The default: the valve where the kernel runs it.
		{DefaultSettings(), fit, ModeOn},
		{DefaultSettings(), uncharged, ModeOff},
	} {
		if got := tt.s.Resolve(tt.f).BacklogValve; got != tt.want {
			t.Errorf("slow readers %v on %+v resolved to %v, want %v", tt.s.BacklogValve, tt.f, got, tt.want)
		}
	}
	// The reader's verdict left to the datapath: given as readers join;
	// asked for, as asked.
	for _, tt := range []struct {
		s    Settings
		f    Features
		want Mode
	}{
		{DefaultSettings(), fit, ModeOff},
		{DefaultSettings(), uncharged, ModeOff},
		{Settings{LateVerdict: ModeAuto}, fit, ModeOff},
		{Settings{LateVerdict: ModeOff}, fit, ModeOff},
		{Settings{LateVerdict: ModeOn, BacklogValve: ModeOff}, fit, ModeOn},
	} {
		if got := tt.s.Resolve(tt.f).LateVerdict; got != tt.want {
			t.Errorf("reader verdict %v (slow readers %v) on %+v resolved to %v, want %v", tt.s.LateVerdict, tt.s.BacklogValve, tt.f, got, tt.want)
		}
	}
	if q := (Settings{OwnerListeners: 7}).Resolve(fit).Quotas(); q != (Quotas{Conns: uint64(DefaultOwnerConns), Listeners: 7, LBConns: uint64(DefaultOwnerLBConns), Affinity: uint64(DefaultOwnerAffinity), UDPTables: uint64(DefaultOwnerUDPTables), EvictTimers: uint64(DefaultOwnerEvictTimers), Msgs: uint64(DefaultOwnerMsgs)}) {
		t.Errorf("quotas of a request with one given: %+v", q)
	}
	with := func(msgTotLen bool, names ...string) Features {
		f := Features{PsockMsgTotLen: msgTotLen}
		for _, n := range names {
			b := sockbugs.Describe(n)
			b.Present = true
			f.Bugs = append(f.Bugs, b)
		}
		return f
	}
	auto := DefaultSettings()
	for _, tt := range []struct {
		s                    Settings
		f                    Features
		bypass, bypassBlocks Mode
	}{
		{auto, fit, ModeOn, ModeOn},
		{auto, with(true, sockbugs.FIONREAD), ModeOff, ModeOn},
		{auto, with(false), ModeOff, ModeOn},
		// The interrupted-read bug, or bugs not probed: per process.
		{auto, with(true, sockbugs.BlockingEAGAIN, sockbugs.Splice), ModeOn, ModeProcess},
		{auto, with(false, sockbugs.FIONREAD, sockbugs.BlockingEAGAIN), ModeOff, ModeProcess},
		{auto, Features{PsockMsgTotLen: true, BugsError: "no netns"}, ModeOff, ModeProcess},
		{Settings{Bypass: ModeOn, BypassBlocking: ModeOn}, with(false, sockbugs.FIONREAD, sockbugs.BlockingEAGAIN), ModeOn, ModeOn},
		{Settings{Bypass: ModeOff, BypassBlocking: ModeOff}, fit, ModeOff, ModeOff},
		{Settings{BypassBlocking: ModeProcess}, fit, ModeOn, ModeProcess},
	} {
		s := tt.s.Resolve(tt.f)
		if s.Bypass != tt.bypass || s.BypassBlocking != tt.bypassBlocks || s.BypassBrief == ModeAuto {
			t.Errorf("%+v on %s: bypass %v, blocking %v, brief %v; want %v, %v and brief decided",
				tt.s, tt.f.Summary(), s.Bypass, s.BypassBlocking, s.BypassBrief, tt.bypass, tt.bypassBlocks)
		}
	}
}

// TestSettingFlags parses every setting from its flag's words, refuses
// what the flag does not take by name, and round-trips through JSON.
func TestSettingFlags(t *testing.T) {
	for _, tt := range []struct {
		flag, value string
		check       func(Settings) bool
		err         string
	}{
		{"bypass", "on", func(s Settings) bool { return s.Bypass == ModeOn }, ""},
		{"bypass", "auto", func(s Settings) bool { return s.Bypass == ModeAuto }, ""},
		{"bypass", "yes", nil, "want one of auto, on, off"},
		{"blocking-sockets", "tcp", func(s Settings) bool { return s.BypassBlocking == ModeOff }, ""},
		{"blocking-sockets", "bypass", func(s Settings) bool { return s.BypassBlocking == ModeOn }, ""},
		{"blocking-sockets", "per-process", func(s Settings) bool { return s.BypassBlocking == ModeProcess }, ""},
		{"blocking-sockets", "maybe", nil, "want one of auto, bypass, tcp, per-process"},
		{"brief-connections", "bypass", func(s Settings) bool { return s.BypassBrief == ModeOn }, ""},
		{"brief-connections", "auto", nil, "want one of bypass, tcp"},
		{"small-streams", "bypass", func(s Settings) bool { return s.BypassSmallStreams == ModeOn }, ""},
		{"small-streams", "auto", nil, "want one of bypass, tcp"},
		{"slow-readers", "valve", func(s Settings) bool { return s.BacklogValve == ModeOn }, ""},
		{"slow-readers", "tcp", func(s Settings) bool { return s.BacklogValve == ModeOff }, ""},
		{"slow-readers", "auto", func(s Settings) bool { return s.BacklogValve == ModeAuto }, ""},
		{"slow-readers", "block", nil, "want one of auto, valve, tcp"},
		{"backlog-limit", "2097152", func(s Settings) bool { return s.BacklogLimit == 2097152 }, ""},
		{"backlog-limit", "-1", nil, "want a number of bytes"},
		{"verdict-window", "0", func(s Settings) bool { return s.VerdictWindow == 0 }, ""},
		{"verdict-window", "1048577", nil, "want at most 1048576 bytes"},
		{"owner-conns", "256", func(s Settings) bool { return s.OwnerConns == 256 }, ""},
		{"owner-conns", "65537", nil, "want at most 65536 entries"},
		{"owner-listeners", "1", func(s Settings) bool { return s.OwnerListeners == 1 }, ""},
		{"owner-lb-conns", "131072", func(s Settings) bool { return s.OwnerLbConns == 131072 }, ""},
		{"owner-lb-conns", "many", nil, "want a number of entries"},
		{"owner-affinity", "16", func(s Settings) bool { return s.OwnerAffinity == 16 }, ""},
		{"service-lb-scope", "host", func(s Settings) bool { return s.LbHostOnly == ModeOn }, ""},
		{"service-lb-scope", "pods", nil, "want one of host, all"},
		{"owner-affinity", "262145", nil, "want at most 262144 entries"},
		{"owner-udp-tables", "64", func(s Settings) bool { return s.OwnerUdpTables == 64 }, ""},
		{"owner-udp-tables", "1048577", nil, "want at most 1048576 tables"},
		{"owner-evict-timers", "8", func(s Settings) bool { return s.OwnerEvictTimers == 8 }, ""},
		{"owner-evict-timers", "131073", nil, "want at most 131072 timers"},
		{"owner-messages", "4096", func(s Settings) bool { return s.OwnerMsgs == 4096 }, ""},
		{"owner-messages", "16777217", nil, "want at most 16777216 messages"},
	} {
		s := DefaultSettings()
		var err error
		found := false
		for _, f := range s.Flags() {
			if f.Name == tt.flag {
				found = true
				err = f.Set(tt.value)
				if err == nil && f.String() != tt.value {
					t.Errorf("--%s %s prints back as %q", tt.flag, tt.value, f.String())
				}
			}
		}
		switch {
		case !found:
			t.Errorf("no flag --%s", tt.flag)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("--%s %s: %v, want %q", tt.flag, tt.value, err, tt.err)
		case tt.err == "" && (err != nil || !tt.check(s)):
			t.Errorf("--%s %s: %v, settings %+v", tt.flag, tt.value, err, s)
		case tt.err == "":
			b, err := json.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			var back Settings
			if err := json.Unmarshal(b, &back); err != nil || back != s {
				t.Errorf("JSON %s reads back as %+v, %v; want %+v", b, back, err, s)
			}
		}
	}
	if err := (Settings{BypassBlocking: 7}).Validate(); err == nil || !strings.Contains(err.Error(), "--blocking-sockets mode(7)") {
		t.Errorf("validating an unknown mode: %v", err)
	}
}

// TestSignalsOf: the rule for processes the datapath did not see (their
// SigCgt) is the datapath's own (SL_SIG_MASK_*): signals that arrive while
// a program runs normally count, an operator's requests, faults and the C
// library's own do not.
func TestSignalsOf(t *testing.T) {
	quiet, interrupts := uint32(bypassSlSignalsSL_SIG_QUIET), uint32(bypassSlSignalsSL_SIG_INTERRUPTS)
	bit := func(sigs ...int) uint64 {
		var m uint64
		for _, s := range sigs {
			m |= 1 << (s - 1)
		}
		return m
	}
	for _, tt := range []struct {
		name   string
		caught uint64
		want   uint32
	}{
		{"none", 0, quiet},
		{"python: SIGINT", bit(2), quiet},
		{"iperf3: SIGHUP, SIGINT, SIGTERM", bit(1, 2, 15), quiet},
		{"faults and SIGPIPE", bit(4, 5, 6, 7, 8, 11, 13, 31), quiet},
		{"the C library's 32 and 33", bit(32, 33), quiet},
		{"qperf: SIGALRM, SIGURG", bit(3, 13, 14, 23), interrupts},
		{"SIGCHLD", bit(17), interrupts},
		{"SIGUSR2 (the JVM)", bit(12), interrupts},
		{"a real-time signal", bit(34), interrupts},
		{"the last one", bit(64), interrupts},
		{"everything (status unreadable)", ^uint64(0), interrupts},
	} {
		if got := SignalsOf(tt.caught); got != tt.want {
			t.Errorf("%s (%#x): %d, want %d", tt.name, tt.caught, got, tt.want)
		}
	}
}
