package main

import (
	"github.com/socklane/socklane/internal/node"
	"github.com/spf13/cobra"
)

// newBypassCmd groups what is set about the bypass at run time.
func newBypassCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bypass",
		Short: "The socket-to-socket bypass: network namespaces kept out of it",
	}
	cmd.AddCommand(newOptOutCmd(g, optOutSpec{
		short: "Keep the TCP connections of network namespaces (/proc/PID/ns/net, /run/netns/NAME) out of the bypass, for programs it cannot serve; without arguments, list them",
		long: "Connections of an opted-out network namespace, as client or as server, stay on TCP from their\n" +
			"next handshake (counted in fallback_opted_out): for programs that read in ways a bypassed socket\n" +
			"cannot serve, such as splice(2) (Go's io.Copy between two TCP connections, proxies), which sees\n" +
			"none of the redirected bytes. Services, policy and events are unchanged.\n" +
			"The agent opts out the pods it attaches that carry the label " + node.BypassOptOutLabel + "=off.",
		kind:    node.BypassOptOut(),
		outVerb: "kept out of the bypass",
		inVerb:  "bypassed again",
	}))
	return cmd
}
