package datapath

import (
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// TestPerSocketMapsHoldEverySocket: the hash maps with an entry per
// socket of the socket maps must have room for every such socket, so that no
// pod, by keeping thousands of its sockets in them, leaves another pod's
// sockets without one, and are allocated as used (the room costs nothing
// until sockets take it). sl_evict_timers is keyed by a socket's key in
// sl_sockmap (slot << 1 | role): without a timer a FIONREAD reader would
// wait for bytes FIONREAD does not count. sl_skb_seqs is keyed by cookie,
// an entry per member of a slot: without one a retransmission's repeated
// head would reach the reader twice.
func TestPerSocketMapsHoldEverySocket(t *testing.T) {
	spec, err := loadBypass()
	if err != nil {
		t.Fatal(err)
	}
	var maps bypassMapSpecs
	if err := spec.Assign(&maps); err != nil {
		t.Fatal(err)
	}
	keys := 2 * maps.SlConns.MaxEntries
	// The two socket maps share one key space: a connection's members
	// join one of them. Each is an array indexed by socket id: it must
	// have an entry for every id, and no more than the per-socket maps.
	for name, m := range map[string]*ebpf.MapSpec{"sl_sockmap": maps.SlSockmap, "sl_sockmap_plain": maps.SlSockmapPlain, "sl_sockmap_late": maps.SlSockmapLate} {
		if m.Type != ebpf.SockMap {
			t.Errorf("%s is a %s, want a SockMap indexed by socket id (the redirect's lookup without a hash)", name, m.Type)
		}
		if got := m.MaxEntries; got != keys {
			t.Errorf("%s holds %d sockets, want one per socket id: %d", name, got, keys)
		}
	}
	// A reader is queued for the late verdict once (--reader-verdict
	// late): the queue holds one per socket id, so no pod fills it.
	if got := maps.SlLateQueue.MaxEntries; got < keys {
		t.Errorf("sl_late_queue holds %d readers, sockets have %d keys: a pod can fill it", got, keys)
	}
	for name, m := range map[string]*ebpf.MapSpec{"sl_evict_timers": maps.SlEvictTimers, "sl_skb_seqs": maps.SlSkbSeqs} {
		if got := m.MaxEntries; got < keys {
			t.Errorf("%s holds %d entries, sockets of the map have %d keys: a pod can fill it", name, got, keys)
		}
		if m.Flags&unix.BPF_F_NO_PREALLOC == 0 {
			t.Errorf("%s is preallocated (flags %#x): room for every socket would cost its full size at load", name, m.Flags)
		}
	}
}
