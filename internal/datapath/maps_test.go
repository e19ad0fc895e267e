package datapath

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestEvictTimersHoldEverySocket: sl_evict_timers is keyed by a socket's
// key in sl_sockhash (slot << 1 | role) and must have room for every such
// key, so that no pod, by keeping thousands of its sockets waiting to
// leave the map, leaves another pod's sockets without a timer (a FIONREAD
// reader of theirs would then wait for bytes FIONREAD does not count). It
// is allocated as used: the room costs nothing until sockets wait.
func TestEvictTimersHoldEverySocket(t *testing.T) {
	spec, err := loadBypass()
	if err != nil {
		t.Fatal(err)
	}
	var maps bypassMapSpecs
	if err := spec.Assign(&maps); err != nil {
		t.Fatal(err)
	}
	keys := 2 * maps.SlConns.MaxEntries
	if got := maps.SlEvictTimers.MaxEntries; got < keys {
		t.Errorf("sl_evict_timers holds %d timers, sockets of the map have %d keys: a pod can fill it", got, keys)
	}
	if got := maps.SlSockhash.MaxEntries; got > keys {
		t.Errorf("sl_sockhash holds %d sockets, more than the %d keys sl_evict_timers is sized for", got, keys)
	}
	if maps.SlEvictTimers.Flags&unix.BPF_F_NO_PREALLOC == 0 {
		t.Errorf("sl_evict_timers is preallocated (flags %#x): room for every socket would cost its full size at load", maps.SlEvictTimers.Flags)
	}
}
