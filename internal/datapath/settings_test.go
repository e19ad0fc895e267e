package datapath

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestSettingsReadBack loads datapaths with different settings and reads
// them back from the loaded programs, and again after adopting the pins
// with other settings asked for (adoption keeps what was loaded).
func TestSettingsReadBack(t *testing.T) {
	for i, want := range []Settings{
		{BacklogLimit: 1 << 20, VerdictWindow: DefaultVerdictWindow},
		{BacklogLimit: 123456, VerdictWindow: 0, BypassBlocking: true},
		{BacklogLimit: 7 << 20, VerdictWindow: 65536, BypassBrief: true},
		{BacklogLimit: 1, VerdictWindow: MaxVerdictWindow, BypassBlocking: true, BypassBrief: true},
	} {
		t.Run(fmt.Sprintf("%+v", want), func(t *testing.T) {
			dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("sltest-set-%d-%d", os.Getpid(), i))
			cfg := Config{PinDir: dir, BacklogLimit: want.BacklogLimit, VerdictWindow: want.VerdictWindow, BypassBlocking: want.BypassBlocking, BypassBrief: want.BypassBrief}
			dp := testDatapathWith(t, cfg)
			if got, err := dp.Settings(); err != nil || got != want {
				t.Fatalf("loaded: settings %+v, %v; want %+v", got, err, want)
			}
			other := Config{PinDir: dir, BacklogLimit: 99, VerdictWindow: 8, BypassBlocking: !want.BypassBlocking, BypassBrief: !want.BypassBrief}
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

// TestConfigSettings checks the settings a Config asks for: a zero
// backlog limit is tcp_rmem's maximum.
func TestConfigSettings(t *testing.T) {
	if got := (Config{}).Settings().BacklogLimit; got != tcpRmemMax() || got == 0 {
		t.Errorf("backlog limit of a zero Config: %d, want tcp_rmem max %d", got, tcpRmemMax())
	}
	if got := (Config{BacklogLimit: 5}).Settings().BacklogLimit; got != 5 {
		t.Errorf("backlog limit 5 read as %d", got)
	}
}
