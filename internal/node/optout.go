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

// ServiceOptOut opts the network namespace at nsPath out of connect-time
// service balancing (out), or back in; it returns the namespace's cookie.
func ServiceOptOut(dp *datapath.Datapath, nsPath string, out bool) (uint64, error) {
	cookie, err := NetnsCookie(nsPath)
	if err != nil {
		return 0, err
	}
	return cookie, dp.SetServiceOptOut(cookie, out)
}

// BypassOptOutLabel on a pod (runtime labels) with the value "off" keeps
// its TCP connections out of the bypass, as client and as server: for
// programs that read in ways a bypassed socket cannot serve (splice(2):
// Go's io.Copy between two TCP connections, proxies).
const BypassOptOutLabel = "socklane.io/bypass"

// BypassOptOut opts the network namespace at nsPath out of the bypass
// (out), or back in; it returns the namespace's cookie.
func BypassOptOut(dp *datapath.Datapath, nsPath string, out bool) (uint64, error) {
	cookie, err := NetnsCookie(nsPath)
	if err != nil {
		return 0, err
	}
	return cookie, dp.SetBypassOptOut(cookie, out)
}
