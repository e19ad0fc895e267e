package datapath

import (
	"fmt"

	"github.com/socklane/socklane/internal/cgroups"
	"github.com/socklane/socklane/internal/procsock"
	"github.com/socklane/socklane/internal/sockdiag"
	"golang.org/x/sys/unix"
)

// seedListeners records the listeners the processes of the cgroup at path
// held before it was attached: no listen() of theirs was seen, and a
// listener not known keeps its connections on TCP until one is learned.
// Returns how many it recorded.
func (d *Datapath) seedListeners(path string) (int, error) {
	ls, err := procsock.InCgroup(path)
	if err != nil {
		return 0, err
	}
	cookies := map[uint64]uint64{} // namespace inode -> cookie
	owners := map[string]uint64{}
	n := 0
	for _, l := range ls {
		var st unix.Stat_t
		if err := unix.Stat(l.NetnsPath, &st); err != nil {
			continue // exited meanwhile
		}
		cookie, ok := cookies[st.Ino]
		if !ok {
			c, err := sockdiag.OpenIn(l.NetnsPath)
			if err != nil {
				continue
			}
			cookie, err = c.NetnsCookie()
			c.Close()
			if err != nil {
				return n, fmt.Errorf("reading the network namespace cookie of process %d: %w", l.Pid, err)
			}
			cookies[st.Ino] = cookie
		}
		owner, ok := owners[l.Cgroup]
		if !ok {
			if owner, err = cgroups.ID(l.Cgroup); err != nil {
				continue
			}
			owners[l.Cgroup] = owner
		}
		ok, err := d.SeedListener(ListenerSeed{Netns: cookie, Port: l.Port, Owner: owner, Blocking: l.Blocking, Caught: l.Caught})
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	return n, nil
}
