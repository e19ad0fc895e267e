package main

import (
	"github.com/socklane/socklane/internal/agent"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/spf13/cobra"
)

// settingsFlags are the datapath's load-time settings. They apply when the
// command loads a new datapath; an adopted one keeps the settings it was
// loaded with, and a flag given that asks for another value is refused.
type settingsFlags struct {
	bypass   string
	backlog  uint32
	blocking string
	brief    string
	window   uint32
	cmd      *cobra.Command
}

func (s *settingsFlags) add(cmd *cobra.Command) {
	s.cmd = cmd
	cmd.Flags().Uint32Var(&s.backlog, agent.SettingBacklogLimit, 0, "receiver backlog in bytes (at least the receiver's SO_RCVBUF) above which, for about 50 ms or at once above twice it, a bypassed direction moves to TCP (0: net.ipv4.tcp_rmem max)")
	cmd.Flags().Uint32Var(&s.window, agent.SettingVerdictWindow, datapath.DefaultVerdictWindow, "sends smaller than this many bytes redirect under one verdict for the next this-many bytes (0: a verdict per send)")
	cmd.Flags().StringVar(&s.brief, agent.SettingBriefConnections, "tcp", "connections to a destination whose last few connections from the same network namespace were brief (one send each way, then close): tcp (cheaper for them; one in 16 still joins the bypass to keep learning) or bypass")
	cmd.Flags().StringVar(&s.blocking, agent.SettingBlockingSockets, "auto", "connections with an end reading in blocking mode: tcp, bypass, or auto (tcp where the kernel's sockmap turns a blocking read interrupted by a signal into EAGAIN, found by behaviour at load)")
	cmd.Flags().StringVar(&s.bypass, agent.SettingBypass, "auto", "bypass connections between managed sockets: on, off (all stay on TCP; services, events and metrics still work), or auto (off where the kernel's FIONREAD answers 0 for redirected bytes, which hangs programs that size their reads by it; found by behaviour at load)")
}

func (s *settingsFlags) config(g *globals, cgroups []string) agent.Config {
	var given []string
	for _, name := range agent.SettingNames() {
		if s.cmd != nil && s.cmd.Flags().Changed(name) {
			given = append(given, name)
		}
	}
	return agent.Config{BPFFS: g.bpffs, PinName: g.name, Cgroups: cgroups, Bypass: s.bypass, BacklogLimit: s.backlog, BlockingSockets: s.blocking, BriefConnections: s.brief,
		VerdictWindow: s.window, SettingsGiven: given}
}
