package main

import (
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/node"
	"github.com/spf13/cobra"
)

// settingsFlags are the datapath's load-time settings, parsed straight
// into the datapath.Settings a load asks for. They apply when the command
// loads a new datapath; an adopted one keeps the settings it was loaded
// with, and a flag given that asks for another value is refused.
type settingsFlags struct {
	settings datapath.Settings
	cmd      *cobra.Command
}

func (s *settingsFlags) add(cmd *cobra.Command) {
	s.cmd = cmd
	s.settings = datapath.DefaultSettings()
	for _, f := range s.settings.Flags() {
		cmd.Flags().Var(f, f.Name, f.Usage)
	}
}

func (s *settingsFlags) config(g *globals) node.Config {
	var given []string
	for _, name := range datapath.SettingNames() {
		if s.cmd != nil && s.cmd.Flags().Changed(name) {
			given = append(given, name)
		}
	}
	return node.Config{BPFFS: g.bpffs, PinName: g.name, Settings: s.settings, SettingsGiven: given}
}
