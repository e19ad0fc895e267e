package datapath

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
)

// SetBypassOptOut keeps the TCP connections of a network namespace (by
// cookie) out of the bypass (out), or lets them in again: as client or
// server they stay on TCP from their next handshake, counted in
// fallback_opted_out. For pods whose programs read in ways a bypassed
// socket cannot serve (splice(2)).
func (d *Datapath) SetBypassOptOut(netns uint64, out bool) error {
	return setOptOut(d.objs.SlBypassOptout, "bypass", netns, out)
}

// BypassOptOuts lists the network namespaces opted out of the bypass, by
// cookie.
func (d *Datapath) BypassOptOuts() ([]uint64, error) {
	return optOuts(d.objs.SlBypassOptout, "sl_bypass_optout")
}

// setOptOut adds a network namespace cookie to an opt-out map, or removes
// it (a namespace not there is no error).
func setOptOut(m *ebpf.Map, what string, netns uint64, out bool) error {
	var err error
	if out {
		err = m.Update(netns, uint32(1), ebpf.UpdateAny)
	} else if err = m.Delete(netns); errors.Is(err, ebpf.ErrKeyNotExist) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("setting the %s opt-out of network namespace %d: %w", what, netns, err)
	}
	return nil
}

// optOuts lists the cookies of an opt-out map, in order.
func optOuts(m *ebpf.Map, name string) ([]uint64, error) {
	all, err := readAll[uint64, uint32](m)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	out := make([]uint64, 0, len(all))
	for k := range all {
		out = append(out, k)
	}
	slices.Sort(out)
	return out, nil
}
