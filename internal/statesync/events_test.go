package statesync

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestEventLog: the log keeps the last eventsKept events in order, hands
// out those after a sequence number, and wakes a waiting reader.
func TestEventLog(t *testing.T) {
	l := newEventLog()
	if evs, _ := l.since(0); len(evs) != 0 {
		t.Fatalf("an empty log gave %v", evs)
	}
	total := eventsKept + 10
	for i := range total {
		l.add(Event{Kind: EventResync, Detail: fmt.Sprint(i)})
	}
	cases := []struct {
		after     uint64
		n         int
		firstSeq  uint64
		firstText string
	}{
		{0, eventsKept, 11, "10"},
		{5, eventsKept, 11, "10"},
		{uint64(total - 3), 3, uint64(total - 2), fmt.Sprint(total - 3)},
		{uint64(total), 0, 0, ""},
	}
	for _, tc := range cases {
		evs, _ := l.since(tc.after)
		if len(evs) != tc.n {
			t.Fatalf("after %d: %d events, want %d", tc.after, len(evs), tc.n)
		}
		if tc.n == 0 {
			continue
		}
		if evs[0].Seq != tc.firstSeq || evs[0].Detail != tc.firstText {
			t.Fatalf("after %d: first %+v, want seq %d %q", tc.after, evs[0], tc.firstSeq, tc.firstText)
		}
		for i := 1; i < len(evs); i++ {
			if evs[i].Seq != evs[i-1].Seq+1 {
				t.Fatalf("after %d: seq %d follows %d", tc.after, evs[i].Seq, evs[i-1].Seq)
			}
		}
	}
	// A reader waiting for more is woken by the next event.
	e := &Engine{events: l}
	got := make(chan []Event, 1)
	go func() { got <- e.Events(context.Background(), uint64(total), true) }()
	time.Sleep(20 * time.Millisecond)
	l.add(Event{Kind: EventDiverged, Detail: "next"})
	select {
	case evs := <-got:
		if len(evs) != 1 || evs[0].Detail != "next" {
			t.Fatalf("the waiting reader got %v", evs)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting reader was not woken")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if evs := e.Events(ctx, uint64(total+1), true); evs != nil {
		t.Fatalf("a wait that timed out gave %v", evs)
	}
}
