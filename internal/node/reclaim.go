package node

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/socklane/socklane/internal/cgroups"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/sockdiag"
	"golang.org/x/sys/unix"
)

// PruneTrackedSockets forgets the load balancer's entries for connected
// sockets their owners closed while the socket's cgroup was detached, so
// that no program saw them go, and returns how many it forgot. Entries
// made while it runs are not looked at; a socket that closes meanwhile
// removes its own entry.
func PruneTrackedSockets(dp *datapath.Datapath) (int, error) {
	tracked, err := dp.Tracked()
	if err != nil || len(tracked) == 0 {
		return 0, err
	}
	open, err := sockdiag.Owned(diagTargets(tracked))
	if err != nil {
		return 0, fmt.Errorf("finding translated sockets: %w", err)
	}
	var gone []uint64
	for _, s := range tracked {
		if !open[s.Cookie] {
			gone = append(gone, s.Cookie)
		}
	}
	return dp.ForgetTracked(gone)
}

// SweepSlots frees the bypass's connection slots whose member sockets all
// closed unseen (their cgroup was detached meanwhile).
func SweepSlots(dp *datapath.Datapath) (datapath.SweepStats, error) {
	return dp.Sweep(func(socks []datapath.MemberSocket) (map[uint64]bool, error) {
		targets := make([]sockdiag.Target, len(socks))
		for i, s := range socks {
			targets[i] = sockdiag.Target{Cookie: s.Cookie, Netns: s.Netns, Protocol: unix.IPPROTO_TCP}
		}
		return sockdiag.Owned(targets)
	})
}

// Reclaim returns what sockets that closed while their cgroup was
// detached left behind: the load balancer's entries and the bypass's
// connection slots; and the ClientIP affinity entries that expired. Errors are logged: the next round tries again.
func Reclaim(dp *datapath.Datapath, log *slog.Logger) {
	if n, err := PruneTrackedSockets(dp); err != nil {
		log.Warn("pruning the load balancer's socket table", "err", err)
	} else if n > 0 {
		log.Info("load balancer forgot closed sockets", "sockets", n)
	}
	if st, err := SweepSlots(dp); err != nil {
		log.Warn("sweeping connection slots", "err", err)
	} else if st.Reclaimed > 0 {
		log.Info("connection slots reclaimed", "reclaimed", st.Reclaimed, "in_use", st.InUse-st.Reclaimed)
	}
	if n, err := dp.ExpireAffinity(); err != nil {
		log.Warn("expiring ClientIP affinity", "err", err)
	} else if n > 0 {
		log.Debug("ClientIP affinity expired", "entries", n)
	}
	if n, err := forgetGoneOwners(dp); err != nil {
		log.Warn("forgetting the quotas of removed cgroups", "err", err)
	} else if n > 0 {
		log.Info("quotas of removed cgroups forgotten", "owners", n)
	}
}

// forgetGoneOwners removes the quota entries, and the listener entries, of
// cgroups that no longer exist.
func forgetGoneOwners(dp *datapath.Datapath) (int, error) {
	root, err := cgroups.Root()
	if err != nil {
		return 0, err
	}
	owners, err := dp.Owners()
	if err != nil {
		return 0, err
	}
	gone := map[uint64]bool{}
	for _, o := range owners {
		if _, err := cgroups.PathOf(root, o.Cgroup); errors.Is(err, cgroups.ErrGone) {
			gone[o.Cgroup] = true
		}
	}
	// Their listeners' close went unseen too.
	if _, err := dp.ForgetListenersOf(gone); err != nil {
		return 0, err
	}
	n := 0
	for id := range gone {
		if err := dp.ForgetOwner(id); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// diagTargets names tracked sockets for sock_diag.
func diagTargets(socks []datapath.TrackedSocket) []sockdiag.Target {
	out := make([]sockdiag.Target, len(socks))
	for i, s := range socks {
		out[i] = sockdiag.Target{Cookie: s.Cookie, Netns: s.Netns, Protocol: s.Protocol.Number()}
	}
	return out
}
