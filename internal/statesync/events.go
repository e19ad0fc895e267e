package statesync

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// EventKind is what happened to the sync (a bounded set).
type EventKind string

// The events the sync reports (`socklane sync events`), each also logged.
const (
	EventPeerConnected   EventKind = "peer-connected"
	EventPeerSilent      EventKind = "peer-silent"
	EventPeerRemoved     EventKind = "peer-removed"
	EventPeerRefused     EventKind = "peer-refused"
	EventResync          EventKind = "resync"
	EventDiverged        EventKind = "diverged"
	EventSnapshotSent    EventKind = "snapshot-sent"
	EventSnapshotApplied EventKind = "snapshot-applied"
	EventRecordsLost     EventKind = "records-lost"
	EventBootstrapLate   EventKind = "bootstrap-timeout"
	EventLeaseWon        EventKind = "lease-won"
	EventLeaseLost       EventKind = "lease-lost"
	EventActive          EventKind = "active"
)

// eventsKept is how many events an agent keeps for `sync events`.
const eventsKept = 1024

// Event is one thing that happened to the sync.
type Event struct {
	Seq    uint64    `json:"seq"`
	Time   time.Time `json:"time"`
	Kind   EventKind `json:"kind"`
	Peer   string    `json:"peer,omitempty"`
	Table  string    `json:"table,omitempty"`
	Detail string    `json:"detail"`
}

func (ev Event) String() string {
	s := fmt.Sprintf("%s %-17s", ev.Time.Format(time.RFC3339Nano), ev.Kind)
	if ev.Peer != "" {
		s += " peer=" + ev.Peer
	}
	if ev.Table != "" {
		s += " table=" + ev.Table
	}
	return s + " " + ev.Detail
}

// eventLog keeps the last events and wakes those waiting for more. It
// has its own lock: events are noted with or without e.mu held.
type eventLog struct {
	mu   sync.Mutex
	ring []Event
	next uint64 // the next event's sequence number (from 1)
	wake chan struct{}
}

func newEventLog() *eventLog {
	return &eventLog{ring: make([]Event, eventsKept), next: 1, wake: make(chan struct{})}
}

func (l *eventLog) add(ev Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ev.Seq = l.next
	l.ring[ev.Seq%eventsKept] = ev
	l.next++
	close(l.wake)
	l.wake = make(chan struct{})
}

// since returns the events kept after seq, and the wake channel closed
// when there are more.
func (l *eventLog) since(seq uint64) ([]Event, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := max(seq+1, 1)
	if l.next > eventsKept && first < l.next-eventsKept {
		first = l.next - eventsKept
	}
	var out []Event
	for s := first; s < l.next; s++ {
		out = append(out, l.ring[s%eventsKept])
	}
	return out, l.wake
}

// event notes what happened and logs it (warnings for the kinds that
// mean data had to be fetched again or a peer was turned away).
func (e *Engine) event(kind EventKind, peer, table, detail string, attrs ...any) {
	e.events.add(Event{Time: time.Now(), Kind: kind, Peer: peer, Table: table, Detail: detail})
	args := []any{"event", string(kind)}
	if peer != "" {
		args = append(args, "peer", peer)
	}
	if table != "" {
		args = append(args, "table", table)
	}
	args = append(args, attrs...)
	level := slog.LevelInfo
	switch kind {
	case EventPeerSilent, EventPeerRefused, EventDiverged, EventRecordsLost, EventBootstrapLate, EventLeaseLost:
		level = slog.LevelWarn
	}
	e.log.Log(context.Background(), level, "sync: "+string(kind), append(args, "detail", detail)...)
}

// Events returns the events kept after seq (0: all kept). With wait, and
// none yet, it waits for one until ctx ends.
func (e *Engine) Events(ctx context.Context, seq uint64, wait bool) []Event {
	for {
		evs, wake := e.events.since(seq)
		if len(evs) > 0 || !wait {
			return evs
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		}
	}
}
