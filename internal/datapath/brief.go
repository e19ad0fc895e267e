package datapath

import "net/netip"

// BriefDest is a destination whose connections from one network namespace
// were not worth joining the bypass: brief (one send each way, then close)
// or with no managed server (remote, or not attached).
type BriefDest struct {
	Dest  netip.AddrPort `json:"dest"`
	NetNS uint64         `json:"netns"`
	// InARow counts such connections in a row; from SL_BRIEF_LEARN on,
	// new connections to Dest from NetNS stay on TCP.
	InARow  uint32 `json:"in_a_row"`
	Skipped uint32 `json:"skipped"` // connections left on TCP since
	NoPeer  bool   `json:"no_peer"` // the last one found no managed server
	// ProbeEvery: one connection in this many still joins, as a probe
	// (doubling from SL_BRIEF_PROBE after each probe; at the latest one
	// second after the last connection that joined).
	ProbeEvery uint32 `json:"probe_every"`
}

// BriefDests reads what the datapath learned of brief connections.
func (d *Datapath) BriefDests() ([]BriefDest, error) {
	var out []BriefDest
	err := d.eachDest(func(k bypassSlDest, v bypassSlDestStat) {
		out = append(out, BriefDest{
			Dest:  netip.AddrPortFrom(wordsAddr(k.Ip), uint16(k.Port)),
			NetNS: k.Netns, InARow: v.Brief, Skipped: v.Skipped, NoPeer: v.Remote != 0,
			ProbeEvery: v.Every,
		})
	})
	return out, err
}

// eachDest calls fn for every entry of sl_brief.
func (d *Datapath) eachDest(fn func(bypassSlDest, bypassSlDestStat)) error {
	return eachEntry(d.objs.SlBrief, bypassMapSlBrief, fn)
}
