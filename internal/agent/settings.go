package agent

import (
	"fmt"
	"strconv"

	"github.com/socklane/socklane/internal/datapath"
)

// The settings' flag names.
const (
	SettingBypass           = "bypass"
	SettingBacklogLimit     = "backlog-limit"
	SettingBlockingSockets  = "blocking-sockets"
	SettingBriefConnections = "brief-connections"
	SettingVerdictWindow    = "verdict-window"
)

// SettingNames lists the settings' flag names.
func SettingNames() []string {
	return []string{SettingBypass, SettingBacklogLimit, SettingBlockingSockets, SettingBriefConnections, SettingVerdictWindow}
}

// datapathConfig is the datapath a new load of c would get.
func (c Config) datapathConfig() datapath.Config {
	bypass, _ := modes(c.Bypass, "on", "off")
	blocking, _ := modes(c.BlockingSockets, "bypass", "tcp")
	return datapath.Config{PinDir: c.PinDir(), Bypass: bypass, BacklogLimit: c.BacklogLimit, BypassBlocking: blocking,
		BypassBrief: c.BriefConnections == "bypass", VerdictWindow: c.VerdictWindow}
}

// modes reads a mode flag's value: "" and "auto" leave it to the kernel's
// bugs, on and off name the two others.
func modes(v, on, off string) (datapath.Mode, bool) {
	switch v {
	case "", "auto":
		return datapath.ModeAuto, true
	case on:
		return datapath.ModeOn, true
	case off:
		return datapath.ModeOff, true
	}
	return datapath.ModeAuto, false
}

// SettingFlags renders each setting as the flag value that asks for it.
func SettingFlags(s datapath.Settings) map[string]string {
	mode := func(bypass bool) string {
		if bypass {
			return "bypass"
		}
		return "tcp"
	}
	onOff := "off"
	if s.Bypass {
		onOff = "on"
	}
	return map[string]string{
		SettingBypass:           onOff,
		SettingBacklogLimit:     strconv.FormatUint(uint64(s.BacklogLimit), 10),
		SettingBlockingSockets:  mode(s.BypassBlocking),
		SettingBriefConnections: mode(s.BypassBrief),
		SettingVerdictWindow:    strconv.FormatUint(uint64(s.VerdictWindow), 10),
	}
}

// checkAdopted refuses settings the user gave that an adopted datapath
// was not loaded with: its programs hold their settings until unloaded,
// and attaching it anyway would silently run other settings than asked.
func checkAdopted(dp *datapath.Datapath, want datapath.Settings, given []string) error {
	if !dp.Adopted() || len(given) == 0 {
		return nil
	}
	have, err := dp.Settings()
	if err != nil {
		return fmt.Errorf("--%s: the settings of the datapath running in %s cannot be read to compare (%w): "+
			"leave the settings flags out to use it as it is, or run `socklane down` and load it again", given[0], dp.PinDir(), err)
	}
	h, w := SettingFlags(have), SettingFlags(want)
	for _, name := range given {
		if h[name] != w[name] {
			return fmt.Errorf("--%s %s: the datapath running in %s was loaded with --%s %s, and a datapath keeps its settings until it is unloaded: "+
				"leave the flag out to use it as it is, or run `socklane down` and load it again with the new setting", name, w[name], dp.PinDir(), name, h[name])
		}
	}
	return nil
}
