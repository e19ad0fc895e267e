package statesync

import (
	"context"
	"fmt"
	"time"

	"github.com/socklane/socklane/internal/syncpb"
)

// sendLoop sends everything this node owes the peer, in order: acks and
// resync requests first, then a snapshot when one is due, then its own
// changes from the log, then, when caught up, a digest or a heartbeat.
func (c *conn) sendLoop(ctx context.Context) error {
	e := c.e
	hb := time.NewTicker(heartbeatInterval)
	defer hb.Stop()
	lastDigest := time.Now()
	for {
		c.mu.Lock()
		ack, resync, snap := c.ackDue, c.resync, c.snapshotDue
		c.ackDue, c.resync, c.snapshotDue = false, 0, false
		c.mu.Unlock()
		if ack {
			e.mu.Lock()
			seq := e.applied[c.remote]
			e.mu.Unlock()
			if err := c.st.send(&syncpb.Frame{Body: &syncpb.Frame_Ack{Ack: &syncpb.Ack{Seq: seq}}}); err != nil {
				return err
			}
		}
		if resync != 0 {
			if err := c.st.send(&syncpb.Frame{Body: &syncpb.Frame_Resync{Resync: &syncpb.ResyncRequest{Reason: resync}}}); err != nil {
				return err
			}
		}
		if snap {
			if err := c.sendSnapshot(); err != nil {
				return err
			}
		}
		e.mu.Lock()
		if !e.rlog.holds(c.cursor) {
			e.mu.Unlock()
			e.stats.resyncs.Add(1)
			e.noteResync(c.peer, "log overflow: the peer fell behind the resend log")
			c.mu.Lock()
			c.snapshotDue = true
			c.mu.Unlock()
			continue
		}
		batch := e.rlog.read(c.cursor, chunkEntries)
		wake := e.wake
		var digest *syncpb.Digest
		if len(batch) == 0 && time.Since(lastDigest) >= e.cfg.DigestInterval {
			digest = &syncpb.Digest{Seq: c.cursor, Tables: e.digests(e.origin)}
			lastDigest = time.Now()
		}
		e.mu.Unlock()
		if len(batch) > 0 {
			if err := c.st.send(&syncpb.Frame{Body: &syncpb.Frame_Changes{Changes: &syncpb.Changes{FirstSeq: c.cursor + 1, Batches: pack(batch)}}}); err != nil {
				return err
			}
			c.cursor += uint64(len(batch))
			e.stats.sent.Add(uint64(len(batch)))
			continue
		}
		if digest != nil {
			if err := c.st.send(&syncpb.Frame{Body: &syncpb.Frame_Digest{Digest: digest}}); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
		case <-c.kick:
		case <-hb.C:
			e.mu.Lock()
			h := &syncpb.Heartbeat{SentUnixNano: time.Now().UnixNano(), Seq: c.cursor, Active: e.active, Applied: e.appliedList()}
			e.mu.Unlock()
			if err := c.st.send(&syncpb.Frame{Body: &syncpb.Frame_Heartbeat{Heartbeat: h}}); err != nil {
				return err
			}
		}
	}
}

// sendSnapshot sends every entry held, then continues after the last
// change the snapshot includes.
func (c *conn) sendSnapshot() error {
	e := c.e
	e.mu.Lock()
	entries, seq := e.snapshot()
	applied := e.appliedList()
	e.mu.Unlock()
	chunk := make([]rec, 0, chunkEntries)
	for i := 0; ; i += chunkEntries {
		j := min(i+chunkEntries, len(entries))
		last := j == len(entries)
		chunk = chunk[:0]
		for _, r := range entries[i:j] {
			chunk = append(chunk, r.rec())
		}
		snap := &syncpb.Snapshot{Batches: pack(chunk), Last: last, Seq: seq, Total: uint64(len(entries))}
		if last {
			snap.Applied = applied
		}
		f := &syncpb.Frame{Body: &syncpb.Frame_Snapshot{Snapshot: snap}}
		if err := c.st.send(f); err != nil {
			return err
		}
		if last {
			break
		}
	}
	c.cursor = seq
	e.stats.snapshotsSent.Add(1)
	e.event(EventSnapshotSent, c.peer, "", fmt.Sprintf("snapshot sent: %d entries up to change %d", len(entries), seq), "entries", len(entries), "seq", seq)
	return nil
}

func (c *conn) recvLoop(ctx context.Context) error {
	e := c.e
	for {
		f, err := c.st.recv()
		if err != nil {
			return fmt.Errorf("receiving from %s: %w", c.peer, err)
		}
		c.mu.Lock()
		c.lastRecv = time.Now()
		c.mu.Unlock()
		switch b := f.GetBody().(type) {
		case *syncpb.Frame_Changes:
			if err := c.onChanges(b.Changes); err != nil {
				return err
			}
		case *syncpb.Frame_Snapshot:
			if err := c.onSnapshot(b.Snapshot); err != nil {
				return err
			}
		case *syncpb.Frame_Ack:
			e.mu.Lock()
			e.peerStatusLocked(c.peer).Acked = b.Ack.GetSeq()
			e.mu.Unlock()
		case *syncpb.Frame_Resync:
			e.stats.resyncs.Add(1)
			e.noteResync(c.peer, "asked by the peer: "+b.Resync.GetReason().String())
			c.mu.Lock()
			c.snapshotDue = true
			c.mu.Unlock()
			c.poke()
		case *syncpb.Frame_Digest:
			c.onDigest(b.Digest)
		case *syncpb.Frame_Heartbeat:
			e.mu.Lock()
			ps := e.peerStatusLocked(c.peer)
			c.peerSeq = max(c.peerSeq, b.Heartbeat.GetSeq())
			ps.PeerSeq, ps.Active = c.peerSeq, b.Heartbeat.GetActive()
			c.lastHeartbeat = time.Now()
			// A heartbeat follows everything the peer had to send: this
			// node has its state (by snapshot, or by changes resent
			// because a snapshot from another peer already held them).
			c.mu.Lock()
			awaiting := c.awaiting
			c.mu.Unlock()
			if !awaiting && c.candidates == nil {
				e.booted[c.peer] = true
			}
			if ps.Active {
				e.lastActive = c.peer
			}
			c.peerApplied = make(map[originID]uint64, len(b.Heartbeat.GetApplied()))
			for _, a := range b.Heartbeat.GetApplied() {
				c.peerApplied[fromProto(a.GetOrigin())] = a.GetSeq()
			}
			ps.Behind = subOrZero(ps.PeerSeq, e.applied[c.remote])
			if ps.Behind == 0 {
				ps.LagSeconds = 0
			}
			e.mu.Unlock()
		case *syncpb.Frame_Refusal:
			return fmt.Errorf("peer %s refused: %s", c.peer, b.Refusal.GetReason())
		case *syncpb.Frame_Hello:
			return fmt.Errorf("peer %s sent a second hello", c.peer)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

func subOrZero(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return 0
}

func (c *conn) askResync(reason syncpb.ResyncRequest_Reason) {
	c.mu.Lock()
	c.resync, c.awaiting = reason, true
	c.mu.Unlock()
	c.poke()
}

func (c *conn) onChanges(ch *syncpb.Changes) error {
	e := c.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if c.awaiting {
		e.stats.dropped.Add(uint64(countBatches(ch.GetBatches())))
		return nil
	}
	applied := e.applied[c.remote]
	first := ch.GetFirstSeq()
	entries, err := unpack(ch.GetBatches(), e.schemas(), nil)
	if err != nil {
		return fmt.Errorf("changes from %s: %w", c.peer, err)
	}
	if len(entries) == 0 {
		return nil
	}
	if first > applied+1 {
		e.stats.dropped.Add(uint64(len(entries)))
		e.stats.resyncs.Add(1)
		e.noteResyncLocked(c.peer, fmt.Sprintf("gap: changes from %d after %d", first, applied))
		c.askResync(syncpb.ResyncRequest_REASON_GAP)
		return nil
	}
	if skip := applied + 1 - first; skip > 0 {
		if skip >= uint64(len(entries)) {
			e.stats.resent.Add(uint64(len(entries)))
			return nil
		}
		e.stats.resent.Add(skip)
		entries = entries[skip:]
	}
	if _, err := e.apply(entries); err != nil {
		return err
	}
	e.applied[c.remote] = applied + uint64(len(entries))
	c.peerSeq = max(c.peerSeq, e.applied[c.remote])
	ps := e.peerStatusLocked(c.peer)
	ps.PeerSeq = c.peerSeq
	if cap := entries[len(entries)-1].captured; cap > 0 {
		ps.LagSeconds = time.Since(time.Unix(0, cap)).Seconds()
	}
	ps.Behind = subOrZero(ps.PeerSeq, e.applied[c.remote])
	c.mu.Lock()
	c.ackDue = true
	c.mu.Unlock()
	c.poke()
	return nil
}

func (c *conn) onSnapshot(s *syncpb.Snapshot) error {
	e := c.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if c.candidates == nil {
		// A new snapshot. What the peer wrote and the snapshot does not
		// hold is gone on the peer: the keys it wrote are candidates,
		// struck off as the snapshot brings them.
		c.candidates, c.snapStart = e.written(c.remote), time.Now()
		e.snapshotting++
		for _, t := range e.tables {
			if len(t.entries) == 0 && s.GetTotal() > 0 {
				t.entries = make(map[string]*entry, s.GetTotal())
			}
		}
	}
	entries, err := unpack(s.GetBatches(), e.schemas(), nil)
	if err != nil {
		return fmt.Errorf("snapshot from %s: %w", c.peer, err)
	}
	for _, r := range entries {
		if m := c.candidates[int(r.table)]; m != nil {
			delete(m, string(r.key))
		}
	}
	if _, err := e.apply(entries); err != nil {
		return err
	}
	if !s.GetLast() {
		return nil
	}
	if err := e.prune(c.remote, c.candidates); err != nil {
		return err
	}
	c.candidates = nil
	e.snapshotting--
	took := time.Since(c.snapStart).Round(time.Millisecond)
	e.event(EventSnapshotApplied, c.peer, "", fmt.Sprintf("snapshot applied: %d entries up to change %d in %v", s.GetTotal(), s.GetSeq(), took), "entries", s.GetTotal(), "seq", s.GetSeq(), "took", took)
	e.applied[c.remote] = s.GetSeq()
	c.peerSeq = max(c.peerSeq, s.GetSeq())
	// The snapshot holds the effects of every change the peer had
	// applied: so does this node now. An origin's own stream skips what
	// it resends below that.
	for _, a := range s.GetApplied() {
		if o := fromProto(a.GetOrigin()); o != e.origin && a.GetSeq() > e.applied[o] {
			e.applied[o] = a.GetSeq()
		}
	}
	c.mu.Lock()
	c.awaiting, c.mismatches, c.ackDue = false, 0, true
	c.mu.Unlock()
	c.poke()
	e.stats.snapshotsApplied.Add(1)
	e.booted[c.peer] = true
	e.peerStatusLocked(c.peer).LastSnapshot = time.Now()
	e.notify()
	return nil
}

// onDigest compares the peer's sums of what it originated with this
// node's copy, when both are at the same change. Two mismatches in a row
// (a third node's newer write to the same key can differ for a moment)
// ask for a snapshot.
func (c *conn) onDigest(d *syncpb.Digest) {
	e := c.e
	e.mu.Lock()
	if e.applied[c.remote] != d.GetSeq() || c.awaiting {
		e.mu.Unlock()
		return
	}
	mine := e.digests(c.remote)
	ps := e.peerStatusLocked(c.peer)
	ps.LastDigest = time.Now()
	same := len(mine) == len(d.GetTables())
	for i := 0; same && i < len(mine); i++ {
		same = mine[i].GetEntries() == d.GetTables()[i].GetEntries() && mine[i].GetSum() == d.GetTables()[i].GetSum()
	}
	ps.DigestOK = same
	e.mu.Unlock()
	if same {
		c.mismatches = 0
		return
	}
	c.mismatches++
	if c.mismatches < 2 {
		return
	}
	c.mismatches = 0
	e.stats.diverged.Add(1)
	e.stats.resyncs.Add(1)
	e.event(EventDiverged, c.peer, "", "digests differ twice in a row: this node's copy of the peer's entries diverged")
	e.noteResync(c.peer, "digest mismatch: this node's copy of the peer's entries diverged")
	c.askResync(syncpb.ResyncRequest_REASON_DIVERGED)
}
