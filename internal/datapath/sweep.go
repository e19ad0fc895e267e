package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// The fields of a connection word (enum sl_word): the slot's generation,
// its state and its members, one bit per role that joined.
func wordGen(w uint64) uint32 { return uint32(w >> bypassSlWordSL_WORD_GEN_SHIFT) }
func wordState(w uint64) uint32 {
	return uint32(w>>bypassSlWordSL_WORD_STATE_SHIFT) & uint32(bypassSlWordSL_WORD_FIELD_MASK)
}
func wordMembers(w uint64) uint32 { return uint32(w) & uint32(bypassSlWordSL_WORD_FIELD_MASK) }

// memberBit is role's bit in a word's members.
func memberBit[R ~int | ~uint32](role R) uint32 { return 1 << uint32(role) }

// eachConn calls fn for every slot of sl_conns in use (not free, with a
// member), read in batches.
func (d *Datapath) eachConn(fn func(slot uint32, c *bypassSlConn)) error {
	n := int(d.objs.SlConns.MaxEntries())
	keys := make([]uint32, 4096)
	vals := make([]bypassSlConn, 4096)
	var cursor ebpf.MapBatchCursor
	for done := 0; done < n; {
		cnt, err := d.objs.SlConns.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < cnt; i++ {
			c := &vals[i]
			if wordState(c.Word) == uint32(bypassSlConnStateSL_CONN_FREE) || wordMembers(c.Word) == 0 {
				continue
			}
			fn(keys[i], c)
		}
		done += cnt
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading sl_conns: %w", err)
		}
	}
	return nil
}

// MemberSocket is a member socket of a connection slot: its cookie and its
// network namespace's.
type MemberSocket struct {
	Cookie, Netns uint64
}

// SweepStats is what a sweep found.
type SweepStats struct {
	InUse     int `json:"in_use"`    // slots with members
	Live      int `json:"live"`      // of them, with a member still open
	Reclaimed int `json:"reclaimed"` // freed: every member was gone
}

// Sweep frees the connection slots whose member sockets are all gone.
// Normally a slot is freed by its last member's close; a socket that
// closes while its cgroup is detached (`detach`, a pod selector, a deleted
// pod) is never seen closing, and its slot, index entry and socket
// pointers would stay. A member is alive if it is still in the socket map
// (the kernel removes a socket from it when it closes), or if owned (the
// caller's sock_diag lookup) says an owner holds it. A slot changed since
// it was read is left for the next sweep.
func (d *Datapath) Sweep(owned func([]MemberSocket) (map[uint64]bool, error)) (SweepStats, error) {
	var st SweepStats
	type cand struct {
		slot uint32
		conn bypassSlConn
	}
	var cands []cand
	var socks []MemberSocket
	err := d.eachConn(func(slot uint32, c *bypassSlConn) {
		st.InUse++
		members := wordMembers(c.Word)
		netns := [2]uint64{c.ClientNetns, c.ServerNetns}
		for role := range uint32(2) {
			if members&memberBit(role) == 0 {
				continue
			}
			var cookie uint64
			if err := d.objs.SlSockmap.Lookup(slot<<1|role, &cookie); err == nil {
				st.Live++
				return
			}
			if err := d.objs.SlSockmapPlain.Lookup(slot<<1|role, &cookie); err == nil {
				st.Live++
				return
			}
		}
		cands = append(cands, cand{slot, *c})
		for role := range 2 {
			if members&memberBit(role) != 0 {
				socks = append(socks, MemberSocket{Cookie: c.Cookie[role], Netns: netns[role]})
			}
		}
	})
	if err != nil || len(cands) == 0 {
		return st, err
	}
	open, err := owned(socks)
	if err != nil {
		return st, fmt.Errorf("finding member sockets: %w", err)
	}
	for _, c := range cands {
		members := wordMembers(c.conn.Word)
		alive := false
		for role := range 2 {
			alive = alive || members&memberBit(role) != 0 && open[c.conn.Cookie[role]]
		}
		if alive {
			st.Live++
			continue
		}
		ok, err := d.reclaim(c.slot, &c.conn)
		if err != nil {
			return st, err
		}
		if ok {
			st.Reclaimed++
		}
	}
	return st, nil
}

// reclaim frees one slot as it was read: sl_reclaim moves its state word
// to free (if unchanged), then its index entry goes and the slot returns
// to the free queue.
func (d *Datapath) reclaim(slot uint32, c *bypassSlConn) (bool, error) {
	ret, err := d.objs.SlReclaim.Run(&ebpf.RunOptions{Context: bypassSlReclaimArgs{Slot: slot, Word: c.Word}})
	if err != nil {
		return false, fmt.Errorf("running sl_reclaim: %w", err)
	}
	if ret != 1 {
		return false, nil
	}
	var ref bypassSlConnRef
	if err := d.objs.SlConnIndex.Lookup(&c.Client, &ref); err == nil && ref.Slot == slot && ref.Gen == wordGen(c.Word) {
		if err := d.objs.SlConnIndex.Delete(&c.Client); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return true, fmt.Errorf("removing a reclaimed slot's index entry: %w", err)
		}
	}
	if err := d.objs.SlConnFree.Update(nil, slot, ebpf.UpdateAny); err != nil {
		return true, fmt.Errorf("returning slot %d to the free queue: %w", slot, err)
	}
	return true, nil
}

// FreeSlots is how many connection slots are free.
func (d *Datapath) FreeSlots() (int, error) {
	in := 0
	if err := d.eachConn(func(uint32, *bypassSlConn) { in++ }); err != nil {
		return 0, err
	}
	return int(d.objs.SlConns.MaxEntries()) - in, nil
}
