package datapath

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/socklane/socklane/internal/service"
	"golang.org/x/sys/unix"
)

// leaseTime is how long one renewal of a reader's lease keeps the
// datapath emitting; readers renew every leaseTime/3, so a reader that
// dies stops the emission within leaseTime.
const leaseTime = 3 * time.Second

// monotonicNow is CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns.
func monotonicNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("reading the monotonic clock: %w", err)
	}
	return uint64(ts.Nano()), nil
}

// clock turns datapath timestamps into wall-clock time.
type clock struct{ offset time.Duration }

func newClock() (clock, error) {
	mono, err := monotonicNow()
	if err != nil {
		return clock{}, err
	}
	return clock{offset: time.Duration(time.Now().UnixNano() - int64(mono))}, nil
}

func (c clock) wall(ns uint64) time.Time { return time.Unix(0, int64(ns)+int64(c.offset)) }

// Event is one datapath event.
type Event struct {
	Time time.Time `json:"time"`
	// Type: established, bypass, tcp, fallback, closed, lb_select,
	// lb_refused, policy_denied; "lost" reports events the ring buffer dropped (Count).
	Type   string         `json:"type"`
	Reason string         `json:"reason,omitempty"`
	Src    netip.AddrPort `json:"src"` // client, or the service address asked for
	Dst    netip.AddrPort `json:"dst"` // server, or the backend chosen
	Dir    string         `json:"dir,omitempty"`
	Role   string         `json:"role,omitempty"`
	Proto  string         `json:"proto"`
	Netns  uint64         `json:"netns_cookie,omitempty"`
	// Closed: totals of the connection, client->server and back.
	Bytes    [2]uint64 `json:"bytes"`
	Msgs     [2]uint64 `json:"msgs"`
	Frontend uint32    `json:"frontend_id,omitempty"`
	// Policy denials: the policy (id; the CLI adds its name) and the
	// identities of both ends (0 world, 1 host).
	Policy      uint32 `json:"policy_id,omitempty"`
	PolicyName  string `json:"policy,omitempty"`
	SrcIdentity uint32 `json:"src_identity,omitempty"`
	DstIdentity uint32 `json:"dst_identity,omitempty"`
	Count       uint64 `json:"count,omitempty"`
	// Port virtualization: the workload (id; the CLI adds its name)
	// whose pool had no port for a bind to virtual port Dst.Port().
	WorkloadID uint32 `json:"workload_id,omitempty"`
	Workload   string `json:"workload,omitempty"`
}

var eventTypes = map[uint32]string{
	uint32(bypassSlEventTypeSL_EV_ESTABLISHED):     "established",
	uint32(bypassSlEventTypeSL_EV_BYPASS):          "bypass",
	uint32(bypassSlEventTypeSL_EV_TCP):             "tcp",
	uint32(bypassSlEventTypeSL_EV_FALLBACK):        "fallback",
	uint32(bypassSlEventTypeSL_EV_CLOSED):          "closed",
	uint32(bypassSlEventTypeSL_EV_LB_SELECT):       "lb_select",
	uint32(bypassSlEventTypeSL_EV_LB_REFUSED):      "lb_refused",
	uint32(bypassSlEventTypeSL_EV_POLICY_DENIED):   "policy_denied",
	uint32(bypassSlEventTypeSL_EV_PORTS_EXHAUSTED): "ports_exhausted",
}

// EventTypes lists the event type names.
func EventTypes() []string {
	return []string{"established", "bypass", "tcp", "fallback", "closed", "lb_select", "lb_refused", "policy_denied", "ports_exhausted", "lost"}
}

var dirNames = map[uint8]string{
	uint8(bypassSlDirSL_DIR_CLIENT_TO_SERVER): "c->s",
	uint8(bypassSlDirSL_DIR_SERVER_TO_CLIENT): "s->c",
	uint8(bypassSlDirSL_DIR_BOTH):             "both",
}

// decodeEvent turns one ring buffer record into an Event.
func decodeEvent(raw []byte, counters []string, clk clock) (Event, error) {
	var e bypassSlEvent
	if err := binary.Read(bytes.NewReader(raw), binary.NativeEndian, &e); err != nil {
		return Event{}, fmt.Errorf("decoding event: %w", err)
	}
	ev := Event{
		Time:     clk.wall(e.TsNs),
		Type:     eventTypes[e.Type],
		Src:      netip.AddrPortFrom(wordsAddr(e.SrcIp), e.SrcPort),
		Dst:      netip.AddrPortFrom(wordsAddr(e.DstIp), e.DstPort),
		Netns:    e.Netns,
		Bytes:    e.Bytes,
		Msgs:     e.Msgs,
		Frontend: e.SvcId,
		Proto:    string(service.ProtocolOf(e.Proto)),
	}
	if ev.Type == "" {
		return ev, fmt.Errorf("unknown event type %d", e.Type)
	}
	if r := int(e.Reason); r > 0 && r < len(counters) {
		ev.Reason = counters[r]
	}
	switch ev.Type {
	case "fallback", "tcp":
		ev.Dir = dirNames[e.Dir]
	case "policy_denied":
		ev.Frontend = 0
		ev.Policy, ev.SrcIdentity, ev.DstIdentity = e.SvcId, e.SrcIdentity, e.DstIdentity
		ev.Dir = "ingress"
		if e.Dir == uint8(servicelbSlPolDirSL_POL_EGRESS) {
			ev.Dir = "egress"
		}
	case "ports_exhausted":
		ev.Frontend, ev.WorkloadID = 0, e.SvcId
	case "closed", "established", "bypass":
		ev.Role = "client"
		if e.Role == uint8(bypassSlRoleSL_ROLE_SERVER) {
			ev.Role = "server"
		}
	}
	return ev, nil
}

// renewLease keeps a settings map's until_ns (its first field) ahead of
// now until ctx ends, then clears it.
func renewLease(ctx context.Context, set func(until uint64) error) (stop func(), err error) {
	update := func() error {
		now, err := monotonicNow()
		if err != nil {
			return err
		}
		return set(now + uint64(leaseTime))
	}
	if err := update(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(leaseTime / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-done:
				return
			case <-t.C:
				_ = update()
			}
		}
	}()
	return func() { close(done); _ = set(0) }, nil
}

// ErrStop, returned by an Events or Capture callback, ends the reading
// without error.
var ErrStop = errors.New("stop reading")

// readRing reads records of m until ctx ends, calling fn with each.
func readRing(ctx context.Context, m *ebpf.Map, fn func([]byte) error) error {
	rd, err := ringbuf.NewReader(m)
	if err != nil {
		return fmt.Errorf("opening ring buffer %s: %w", m, err)
	}
	defer rd.Close()
	var rec ringbuf.Record
	for {
		rd.SetDeadline(time.Now().Add(200 * time.Millisecond))
		err := rd.ReadInto(&rec)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			if ctx.Err() != nil {
				return nil
			}
			if err := fn(nil); errors.Is(err, ErrStop) { // a tick: lets fn report losses
				return nil
			} else if err != nil {
				return err
			}
			continue
		case err != nil:
			return fmt.Errorf("reading ring buffer %s: %w", m, err)
		}
		if err := fn(rec.RawSample); errors.Is(err, ErrStop) {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// lostEvents sums the two programs' lost-event counters.
func (d *Datapath) lostEvents() (uint64, error) {
	c, err := d.Counters()
	if err != nil {
		return 0, err
	}
	lb, err := d.LBCounters()
	if err != nil {
		return 0, err
	}
	return c.Get(bypassSlCounterSL_C_EVENTS_LOST) + lb.Get(servicelbSlLbCounterSL_LB_EVENTS_LOST), nil
}

// Events turns the event stream on and calls fn with each event until ctx
// ends or fn fails; then the stream is turned off again. Events the ring
// buffer dropped are reported as events of type "lost". One reader at a
// time: the ring buffer has one consumer.
func (d *Datapath) Events(ctx context.Context, ready func(), fn func(Event) error) error {
	counters := d.counterNames
	clk, err := newClock()
	if err != nil {
		return err
	}
	lost, err := d.lostEvents()
	if err != nil {
		return err
	}
	stop, err := renewLease(ctx, func(until uint64) error {
		return d.objs.SlEvSettings.Update(uint32(0), bypassSlEventsCfg{UntilNs: until}, ebpf.UpdateAny)
	})
	if err != nil {
		return fmt.Errorf("turning events on: %w", err)
	}
	defer stop()
	if ready != nil {
		ready()
	}
	lastCheck := time.Now()
	return readRing(ctx, d.objs.SlEvents, func(raw []byte) error {
		if raw != nil {
			ev, err := decodeEvent(raw, counters, clk)
			if err != nil {
				return err
			}
			if err := fn(ev); err != nil {
				return err
			}
		}
		if time.Since(lastCheck) < time.Second && raw != nil {
			return nil
		}
		lastCheck = time.Now()
		now, err := d.lostEvents()
		if err != nil {
			return err
		}
		if now > lost {
			n := now - lost
			lost = now
			return fn(Event{Time: time.Now(), Type: "lost", Count: n})
		}
		return nil
	})
}
