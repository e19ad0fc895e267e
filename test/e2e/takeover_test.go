package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/peer"
	"github.com/socklane/socklane/internal/testutil"
)

// TestConnectionTakeover is the attack of a process that owns a network
// namespace (as root, or as an unprivileged user through a user namespace)
// in a managed pod: it gives its loopback a victim client's and a managed
// server's addresses and plants client sockets with the victim's 4-tuples
// (connections whose SYN netfilter sends elsewhere, or TCP_REPAIR sockets
// established without a packet). The victim, in an unmanaged pod, then
// connects from those very ports to the managed server. Every reply must
// reach the victim and nothing the attacker: the server's socket never
// joins a planted client.
func TestConnectionTakeover(t *testing.T) {
	const ports = "41000-41049"
	tests := []struct {
		name         string
		unprivileged bool
		mode         string
	}{
		{"dnat as root", false, "dnat"},
		{"dnat as uid 65534 in a user namespace", true, "dnat"},
		{"tcp_repair as uid 65534 in a user namespace", true, "repair"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			testutil.RequireCommand(t, "unshare")
			testutil.RequireCommand(t, "setpriv")
			testutil.RequireCommand(t, "nft")
			b := testutil.Bed(t)
			in := testutil.NewInstance(t)
			srv, victim, attacker := testutil.Pod(t, b, "server"), testutil.Pod(t, b, "victim"), testutil.Pod(t, b, "attacker")
			in.Attach(srv, attacker)
			target := netip.AddrPortFrom(srv.IPv4, 9000)
			start(t, srv, in.Bin, "peer", "echo", "0.0.0.0:9000")
			waitPort(t, srv, "0.0.0.0:9000")

			plant := []string{in.Bin, "peer", "plant", "--client", victim.IPv4.String(), "--server", target.String(),
				"--ports", ports, "--mode", tt.mode, "--for", "20s"}
			var argv []string
			if tt.unprivileged {
				argv = append([]string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "unshare", "-Urn"}, plant...)
			} else {
				argv = append([]string{"unshare", "-n"}, plant...)
			}
			cmd, err := attacker.Command(argv[0], argv[1:]...)
			if err != nil {
				t.Fatal(err)
			}
			var out, logs lockedBuffer
			cmd.Stdout, cmd.Stderr = &out, &logs
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			waitForLog(t, &logs, func() bool { return strings.Contains(logs.String(), "planted 50") })
			before := in.Counters()

			v := start(t, victim, in.Bin, "peer", "victim", "--from", victim.IPv4.String(), "--ports", ports, target.String())
			if err := v.wait(t, time.Minute); err != nil {
				t.Fatalf("victim: %v: %s", err, v.err.String())
			}
			var rep peer.VictimReport
			if err := json.Unmarshal(v.out.Bytes(), &rep); err != nil {
				t.Fatalf("victim report: %v: %s", err, v.out.String())
			}
			// Give a hijacked server time to answer the attacker.
			time.Sleep(300 * time.Millisecond)
			d := testutil.Delta(before, in.Counters())
			_ = cmd.Process.Signal(os.Interrupt)
			_ = cmd.Wait()
			var att peer.PlantReport
			if err := json.Unmarshal([]byte(out.String()), &att); err != nil {
				t.Fatalf("attacker report: %v: %s / %s", err, out.String(), logs.String())
			}
			failed := rep.Failed
			if len(failed) > 3 {
				failed = append(failed[:3:3], fmt.Sprintf("and %d more", len(rep.Failed)-3))
			}
			t.Logf("victim: %d of %d ok; attacker %+v; counters %s", rep.OK, rep.Conns, att, nonzero(d))
			if rep.OK != rep.Conns || rep.Conns != 50 {
				t.Errorf("victim connections: %d of %d echoed back intact; failures: %v", rep.OK, rep.Conns, failed)
			}
			if att.Received != 0 || att.Injected != 0 {
				t.Errorf("the attacker received %d bytes of the victim's connections and injected %d", att.Received, att.Injected)
			}
			// Kernel evidence: the server accepted 50 connections and
			// joined none of them to anything.
			mustAtLeast(t, d, "established_passive", 50)
			mustEqual(t, d, "conns_bypassed", 0)
			mustEqual(t, d, "redirect_msgs", 0)
			if c := in.Counters(); tt.mode == "repair" && c["fallback_no_handshake"] < 50 {
				// Planted before `before`: the instance's totals.
				t.Errorf("fallback_no_handshake = %d, want >= 50 (one per TCP_REPAIR socket)", c["fallback_no_handshake"])
			}
		})
	}
}
