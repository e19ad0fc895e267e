package datapath

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/socklane/socklane/internal/sockbugs"
)

// TestSettingsReadBack loads datapaths with different settings and reads
// them back from the loaded programs, and again after adopting the pins
// with other settings asked for (adoption keeps what was loaded).
func TestSettingsReadBack(t *testing.T) {
	for i, want := range []Settings{
		{Bypass: true, BacklogLimit: 1 << 20, VerdictWindow: DefaultVerdictWindow},
		{Bypass: true, BacklogLimit: 123456, VerdictWindow: 0, BypassBlocking: true},
		{Bypass: false, BacklogLimit: 7 << 20, VerdictWindow: 65536, BypassBrief: true},
		{Bypass: true, BacklogLimit: 1, VerdictWindow: MaxVerdictWindow, BypassBlocking: true, BypassBrief: true},
	} {
		t.Run(fmt.Sprintf("%+v", want), func(t *testing.T) {
			dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("sltest-set-%d-%d", os.Getpid(), i))
			cfg := Config{PinDir: dir, Bypass: mode(want.Bypass), BacklogLimit: want.BacklogLimit, VerdictWindow: want.VerdictWindow,
				BypassBlocking: mode(want.BypassBlocking), BypassBrief: want.BypassBrief}
			dp := testDatapathWith(t, cfg)
			if got, err := dp.Settings(); err != nil || got != want {
				t.Fatalf("loaded: settings %+v, %v; want %+v", got, err, want)
			}
			other := Config{PinDir: dir, Bypass: mode(!want.Bypass), BacklogLimit: 99, VerdictWindow: 8, BypassBlocking: mode(!want.BypassBlocking), BypassBrief: !want.BypassBrief}
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
		})
	}
}

func mode(on bool) Mode {
	if on {
		return ModeOn
	}
	return ModeOff
}

// TestConfigSettings checks the settings a Config asks for: a zero
// backlog limit is tcp_rmem's maximum, and the modes left to the kernel
// follow the bugs found (none probed counts as all found).
func TestConfigSettings(t *testing.T) {
	fit := Features{PsockMsgTotLen: true}
	if got := (Config{}).Settings(fit).BacklogLimit; got != tcpRmemMax() || got == 0 {
		t.Errorf("backlog limit of a zero Config: %d, want tcp_rmem max %d", got, tcpRmemMax())
	}
	if got := (Config{BacklogLimit: 5}).Settings(fit).BacklogLimit; got != 5 {
		t.Errorf("backlog limit 5 read as %d", got)
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
	for _, tt := range []struct {
		cfg                  Config
		f                    Features
		bypass, bypassBlocks bool
	}{
		{Config{}, fit, true, true},
		{Config{}, with(true, sockbugs.FIONREAD), false, true},
		{Config{}, with(false), false, true},
		{Config{}, with(true, sockbugs.BlockingEAGAIN, sockbugs.Splice), true, false},
		{Config{}, with(false, sockbugs.FIONREAD, sockbugs.BlockingEAGAIN), false, false},
		{Config{}, Features{PsockMsgTotLen: true, BugsError: "no netns"}, false, false},
		{Config{Bypass: ModeOn, BypassBlocking: ModeOn}, with(false, sockbugs.FIONREAD, sockbugs.BlockingEAGAIN), true, true},
		{Config{Bypass: ModeOff, BypassBlocking: ModeOff}, fit, false, false},
	} {
		s := tt.cfg.Settings(tt.f)
		if s.Bypass != tt.bypass || s.BypassBlocking != tt.bypassBlocks {
			t.Errorf("%+v on %s: bypass %v, blocking %v; want %v, %v",
				tt.cfg, tt.f.Summary(), s.Bypass, s.BypassBlocking, tt.bypass, tt.bypassBlocks)
		}
	}
}
