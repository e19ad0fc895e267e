package statesync

import (
	"fmt"
	"time"

	"github.com/socklane/socklane/internal/syncpb"
)

// PeerStatus is what a node knows of one peer.
type PeerStatus struct {
	Name      string    `json:"name"`
	Address   string    `json:"address,omitempty"`
	Connected bool      `json:"connected"`
	Since     time.Time `json:"since,omitzero"`
	Origin    string    `json:"origin,omitempty"`
	Active    bool      `json:"active"`
	// Acked: how far the peer applied this node's changes.
	Acked uint64 `json:"acked"`
	// PeerSeq: the peer's last change it said it sent; Behind: how many
	// of them this node has not applied.
	PeerSeq    uint64    `json:"peer_seq"`
	Behind     uint64    `json:"behind"`
	LagSeconds float64   `json:"lag_seconds"`
	LastResync time.Time `json:"last_resync,omitzero"`
	Resync     string    `json:"resync_reason,omitempty"`
	// LastSnapshot: when this node last applied the peer's snapshot.
	LastSnapshot time.Time `json:"last_snapshot,omitzero"`
	LastDigest   time.Time `json:"last_digest,omitzero"`
	DigestOK     bool      `json:"digest_ok"`
	Err          string    `json:"error,omitempty"`
}

// TableStatus is one synced table.
type TableStatus struct {
	Name       string `json:"name"`
	Mode       string `json:"mode"`
	Entries    int    `json:"entries"`
	Tombstones int    `json:"tombstones"`
	Publishing bool   `json:"publishing"`
	// Capture is how writes to the map are found: change records of its
	// writers, traced map updates, or reading the map every poll
	// interval (CaptureWhy says why not traced).
	Capture    string `json:"capture,omitempty"`
	CaptureWhy string `json:"capture_why,omitempty"`
}

// How a table's writes are captured.
const (
	CaptureRecords = "records"
	CaptureTrace   = "trace"
	CapturePoll    = "poll"
)

// setCapture says how table ti's writes are captured now.
func (e *Engine) setCapture(ti int, how string) {
	e.mu.Lock()
	e.tables[ti].capture = how
	e.mu.Unlock()
}

// setCaptureWhy says why table ti's writes are not traced.
func (e *Engine) setCaptureWhy(ti int, why string) {
	e.mu.Lock()
	e.tables[ti].captureWhy = why
	e.mu.Unlock()
}

// Counters are the totals since start.
type Counters struct {
	Published        uint64 `json:"published"`
	Sent             uint64 `json:"sent"`
	Applied          uint64 `json:"applied"`
	Stale            uint64 `json:"stale"`
	Resent           uint64 `json:"resent"`
	Dropped          uint64 `json:"dropped"`
	SnapshotsSent    uint64 `json:"snapshots_sent"`
	SnapshotsApplied uint64 `json:"snapshots_applied"`
	Resyncs          uint64 `json:"resyncs"`
	Refused          uint64 `json:"refused"`
	Diverged         uint64 `json:"diverged"`
	LostRecords      uint64 `json:"lost_records"`
	Polls            uint64 `json:"polls"`
	PollChanges      uint64 `json:"poll_changes"`
}

// Status is `socklane sync status`.
type Status struct {
	Node         string         `json:"node"`
	Origin       string         `json:"origin"`
	Seq          uint64         `json:"seq"`
	LogFirst     uint64         `json:"log_first"`
	Active       bool           `json:"active"`
	Bootstrapped bool           `json:"bootstrapped"`
	LastRefusal  string         `json:"last_refusal,omitempty"`
	Takeover     TakeoverStatus `json:"takeover"`
	Peers        []PeerStatus   `json:"peers"`
	Tables       []TableStatus  `json:"tables"`
	Counters     Counters       `json:"counters"`
}

func (e *Engine) peerStatusLocked(name string) *PeerStatus {
	ps := e.peers[name]
	if ps == nil {
		ps = &PeerStatus{Name: name}
		e.peers[name] = ps
	}
	return ps
}

func (e *Engine) noteResync(peer, why string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.noteResyncLocked(peer, why)
}

func (e *Engine) noteResyncLocked(peer, why string) {
	ps := e.peerStatusLocked(peer)
	ps.LastResync, ps.Resync = time.Now(), why
	e.event(EventResync, peer, "", "resync: "+why)
}

func (e *Engine) setPeerError(peer string, err error) {
	if err == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.peerStatusLocked(peer).Err = err.Error()
}

// Status reports the sync's state.
func (e *Engine) Status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := Status{
		Node: e.cfg.Node, Origin: fmt.Sprintf("%s/%016x", e.origin.node, e.origin.incarnation),
		Seq: e.rlog.last, LogFirst: e.rlog.first, Active: e.active, LastRefusal: e.lastRefusal,
		Takeover: e.takeoverStatusLocked(),
	}
	select {
	case <-e.bootstrapped:
		st.Bootstrapped = true
	default:
	}
	for _, p := range e.peerset.list {
		st.Peers = append(st.Peers, *e.peerStatusLocked(p.Name))
	}
	for ti, t := range e.tables {
		ts := TableStatus{Name: t.name, Mode: modeName(t.schema.GetMode()), Publishing: e.publishes(ti), Entries: t.nLive, Tombstones: t.nDead,
			Capture: t.capture, CaptureWhy: t.captureWhy}
		st.Tables = append(st.Tables, ts)
	}
	s := &e.stats
	st.Counters = Counters{
		Published: s.published.Load(), Sent: s.sent.Load(), Applied: s.applied.Load(), Stale: s.stale.Load(),
		Resent: s.resent.Load(), Dropped: s.dropped.Load(), SnapshotsSent: s.snapshotsSent.Load(),
		SnapshotsApplied: s.snapshotsApplied.Load(), Resyncs: s.resyncs.Load(), Refused: s.refused.Load(),
		Diverged: s.diverged.Load(), LostRecords: s.lost.Load(), Polls: s.polls.Load(), PollChanges: s.pollChanges.Load(),
	}
	return st
}

func modeName(m syncpb.Mode) string {
	switch m {
	case syncpb.Mode_MODE_SHARED:
		return "shared"
	case syncpb.Mode_MODE_ACTIVE_STANDBY:
		return "active-standby"
	}
	return m.String()
}
