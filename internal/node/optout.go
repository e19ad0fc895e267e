package node

import (
	"fmt"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/sockdiag"
)

// OptOutLabel on a pod (runtime labels: the kubelet copies the pod's)
// with the value "off" leaves its connects to service addresses to the
// node's per-packet proxy: a service mesh's sidecar then sees the
// cluster IP it expects.
const OptOutLabel = "socklane.io/service-lb"

// NetnsCookie is the cookie of the network namespace at nsPath (a
// /proc/PID/ns/net or a bind mount of one).
func NetnsCookie(nsPath string) (uint64, error) {
	c, err := sockdiag.OpenIn(nsPath)
	if err != nil {
		return 0, fmt.Errorf("entering network namespace %s: %w", nsPath, err)
	}
	defer c.Close()
	return c.NetnsCookie()
}

// BypassOptOutLabel on a pod (runtime labels) with the value "off" keeps
// its TCP connections out of the bypass, as client and as server: for
// programs that read in ways a bypassed socket cannot serve (splice(2):
// Go's io.Copy between two TCP connections, proxies).
const BypassOptOutLabel = "socklane.io/bypass"

// OptOut is a part of the datapath that network namespaces can be kept
// out of, by cookie.
type OptOut struct {
	// Label, with the value "off" on a pod, has the agent opt the pod out.
	Label string
	// What the namespace is kept out of, for messages.
	What string
	set  func(dp *datapath.Datapath, netns uint64, out bool) error
	list func(dp *datapath.Datapath) ([]uint64, error)
}

// ServiceOptOut is connect-time service balancing: an opted-out
// namespace's connects to service addresses are left to the node's
// per-packet proxy.
func ServiceOptOut() OptOut {
	return OptOut{Label: OptOutLabel, What: "connect-time service balancing",
		set: (*datapath.Datapath).SetServiceOptOut, list: (*datapath.Datapath).ServiceOptOuts}
}

// BypassOptOut is the bypass: an opted-out namespace's TCP connections
// stay on TCP.
func BypassOptOut() OptOut {
	return OptOut{Label: BypassOptOutLabel, What: "the bypass",
		set: (*datapath.Datapath).SetBypassOptOut, list: (*datapath.Datapath).BypassOptOuts}
}

// OptOuts are every opt-out, as the agent applies their labels.
func OptOuts() []OptOut { return []OptOut{ServiceOptOut(), BypassOptOut()} }

// Apply opts the network namespace at nsPath out (out), or back in; it
// returns the namespace's cookie.
func (o OptOut) Apply(dp *datapath.Datapath, nsPath string, out bool) (uint64, error) {
	cookie, err := NetnsCookie(nsPath)
	if err != nil {
		return 0, err
	}
	return cookie, o.set(dp, cookie, out)
}

// Set opts the network namespace whose cookie is netns out, or back in.
func (o OptOut) Set(dp *datapath.Datapath, netns uint64, out bool) error {
	return o.set(dp, netns, out)
}

// List is the cookies of the namespaces opted out, in order.
func (o OptOut) List(dp *datapath.Datapath) ([]uint64, error) { return o.list(dp) }
