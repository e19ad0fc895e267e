package statesync

import (
	"context"
	"fmt"
	"time"

	"github.com/socklane/socklane/internal/syncpb"
)

// takeover is the state of this node's leadership of the active-standby
// tables: holding the lease is not enough to publish, the node must
// first have every change the last active node's peers have of any
// origin (gated takeover).
type takeover struct {
	leader   bool
	since    time.Time // the lease was won
	behind   uint64    // changes still missing at the last check
	missing  string    // whose, and from which peer they are asked
	atLease  uint64    // changes missing when the lease was won
	tookOver time.Time
	asked    time.Time // last snapshot asked for the takeover
}

// TakeoverStatus is the takeover's part of Status.
type TakeoverStatus struct {
	Leader   bool      `json:"leader"`
	Since    time.Time `json:"since,omitzero"`
	Behind   uint64    `json:"behind"`
	Missing  string    `json:"missing,omitempty"`
	AtLease  uint64    `json:"behind_when_elected"`
	TookOver time.Time `json:"took_over,omitzero"`
}

// SetLeader is called by the elector when this node wins or loses the
// lease. Losing it stops publishing at once; winning it starts the
// catch-up that ends with the node active.
func (e *Engine) SetLeader(leader bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if leader == e.take.leader {
		return
	}
	e.take.leader = leader
	if !leader {
		if e.active {
			e.event(EventLeaseLost, "", "", "lease lost: standing by")
		}
		e.active = false
		return
	}
	e.take.since, e.take.tookOver, e.take.asked = time.Now(), time.Time{}, time.Time{}
	e.take.atLease, e.take.missing = e.behindLocked()
	e.take.behind = e.take.atLease
	e.event(EventLeaseWon, "", "", fmt.Sprintf("lease won: catching up (%d changes behind) before taking over", e.take.atLease), "missing", e.take.missing)
}

// behindLocked is how many changes of other origins some connected peer
// has applied and this node has not, and the worst case: the origin and
// the peer to ask for a snapshot ("" when the origin itself will still
// send them). e.mu held.
func (e *Engine) behindLocked() (uint64, string) {
	var total, worst uint64
	missing := ""
	for _, c := range e.conns {
		for o, seq := range c.peerApplied {
			if o == e.origin {
				continue
			}
			d := subOrZero(seq, e.applied[o])
			if d == 0 {
				continue
			}
			total += d
			if d > worst {
				worst = d
				missing = fmt.Sprintf("%d changes of %s/%016x, which %s has", d, o.node, o.incarnation, c.peer)
			}
		}
		// What the peer itself sent and this node has not applied.
		if d := subOrZero(c.peerSeq, e.applied[c.remote]); d > 0 {
			total += d
		}
	}
	return total, missing
}

// gate makes a leader active once it is caught up, asking for snapshots
// from the peers that have what the last active node sent and it does
// not.
func (e *Engine) gate(ctx context.Context) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		select {
		case <-e.bootstrapped:
		default:
			continue
		}
		e.mu.Lock()
		if !e.take.leader || e.active {
			e.mu.Unlock()
			continue
		}
		behind, missing := e.behindLocked()
		unheard := e.unheardLocked()
		if behind == 0 && len(unheard) > 0 {
			missing = fmt.Sprintf("waiting to hear from %v (what they have of the last active node's changes)", unheard)
		}
		e.take.behind, e.take.missing = behind, missing
		waited := time.Since(e.take.since)
		if behind == 0 && e.snapshotting == 0 && (len(unheard) == 0 || waited > e.cfg.TakeoverTimeout) {
			if len(unheard) > 0 {
				e.log.Warn("sync: taking over without word from every peer", "unheard", unheard, "waited", waited.Round(time.Millisecond))
			}
			e.active = true
			e.take.tookOver = time.Now()
			detail := fmt.Sprintf("caught up after %v (%d changes behind when elected): active", time.Since(e.take.since).Round(time.Millisecond), e.take.atLease)
			if len(unheard) > 0 {
				detail += fmt.Sprintf("; without word from %v", unheard)
			}
			e.event(EventActive, "", "", detail)
			e.notify()
			e.mu.Unlock()
			continue
		}
		// Ask the peer that has most of what is missing for a snapshot,
		// at most every two seconds.
		var ask *conn
		var best uint64
		for _, c := range e.conns {
			for o, seq := range c.peerApplied {
				if o == e.origin || e.conns[o.node] != nil && e.conns[o.node].remote == o {
					continue // the origin itself is connected: its stream brings them
				}
				if d := subOrZero(seq, e.applied[o]); d > best {
					best, ask = d, c
				}
			}
		}
		now := time.Now()
		if ask != nil && now.Sub(e.take.asked) > 2*time.Second && e.snapshotting == 0 {
			e.take.asked = now
			e.stats.resyncs.Add(1)
			e.noteResyncLocked(ask.peer, fmt.Sprintf("takeover: %s", missing))
			e.mu.Unlock()
			ask.askResync(syncpb.ResyncRequest_REASON_TAKEOVER)
			continue
		}
		e.mu.Unlock()
	}
}

// unheardLocked lists the peers, other than the last active node, that
// have sent no heartbeat since this node won the lease: each may hold
// changes of the last active node this node lacks. e.mu held.
func (e *Engine) unheardLocked() []string {
	var out []string
	for _, p := range e.peerset.list {
		if p.Name == e.lastActive {
			continue
		}
		if c := e.conns[p.Name]; c == nil || c.lastHeartbeat.Before(e.take.since) {
			out = append(out, p.Name)
		}
	}
	return out
}

func (e *Engine) takeoverStatusLocked() TakeoverStatus {
	return TakeoverStatus{Leader: e.take.leader, Since: e.take.since, Behind: e.take.behind, Missing: e.take.missing,
		AtLease: e.take.atLease, TookOver: e.take.tookOver}
}
