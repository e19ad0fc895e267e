package datapath

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
)

// MaxSnap is the most payload bytes a capture keeps per message.
const MaxSnap = uint32(bypassSlCapLimitsSL_CAP_SNAP_MAX) - 1

// CaptureConfig selects what a capture records.
type CaptureConfig struct {
	Netns uint64 // connections with an end in this network namespace; 0: any
	Port  uint16 // connections with this port at an end; 0: any
	Snap  uint32 // payload bytes per message, at most MaxSnap
	Rate  uint32 // messages per second per CPU; 0: unlimited
}

// CapturedMessage is one bypassed message as the datapath saw it.
type CapturedMessage struct {
	Time     time.Time
	Src, Dst netip.AddrPort
	Dir      uint8  // 0 client->server, 1 server->client
	Conn     uint64 // connection identity: slot << 32 | generation
	Offset   uint64 // stream offset of its first byte in its direction
	Len      uint32 // its length; Payload holds the first bytes
	Payload  []byte
}

// CaptureLoss counts messages a capture missed.
type CaptureLoss struct {
	RingFull, RateLimited uint64
}

func (d *Datapath) captureCounters() (captured uint64, loss CaptureLoss, err error) {
	c, err := d.Counters()
	if err != nil {
		return 0, loss, err
	}
	return c.Get(bypassSlCounterSL_C_CAPTURED), CaptureLoss{RingFull: c.Get(bypassSlCounterSL_C_CAPTURE_LOST), RateLimited: c.Get(bypassSlCounterSL_C_CAPTURE_RATE_DROPS)}, nil
}

// Capture records the payload of bypassed messages matching cfg and calls
// fn with each until ctx ends or fn fails. While it runs, captured
// connections get a verdict per send (no verdict windows). It returns
// what was missed during the capture.
func (d *Datapath) Capture(ctx context.Context, cfg CaptureConfig, ready func(), fn func(CapturedMessage) error) (CaptureLoss, error) {
	if cfg.Snap > MaxSnap {
		return CaptureLoss{}, fmt.Errorf("snap length %d: at most %d bytes", cfg.Snap, MaxSnap)
	}
	clk, err := newClock()
	if err != nil {
		return CaptureLoss{}, err
	}
	_, before, err := d.captureCounters()
	if err != nil {
		return CaptureLoss{}, err
	}
	stop, err := renewLease(ctx, func(until uint64) error {
		v := bypassSlCaptureCfg{UntilNs: until, Netns: cfg.Netns, Port: uint32(cfg.Port), Snap: cfg.Snap, Rate: cfg.Rate}
		return d.objs.SlCapSettings.Update(uint32(0), v, ebpf.UpdateAny)
	})
	if err != nil {
		return CaptureLoss{}, fmt.Errorf("turning capture on: %w", err)
	}
	if ready != nil {
		ready()
	}
	hdrSize := binary.Size(bypassSlCapHdr{})
	err = readRing(ctx, d.objs.SlCapture, func(raw []byte) error {
		if raw == nil {
			return nil
		}
		if len(raw) < hdrSize {
			return fmt.Errorf("capture record of %d bytes", len(raw))
		}
		var h bypassSlCapHdr
		if err := binary.Read(bytes.NewReader(raw[:hdrSize]), binary.NativeEndian, &h); err != nil {
			return fmt.Errorf("decoding capture record: %w", err)
		}
		n := min(int(h.Caplen), len(raw)-hdrSize)
		return fn(CapturedMessage{
			Time:    clk.wall(h.TsNs),
			Src:     netip.AddrPortFrom(wordsAddr(h.SrcIp), h.SrcPort),
			Dst:     netip.AddrPortFrom(wordsAddr(h.DstIp), h.DstPort),
			Dir:     h.Dir,
			Conn:    uint64(h.Slot)<<32 | uint64(h.Gen),
			Offset:  h.Offset,
			Len:     h.Len,
			Payload: bytes.Clone(raw[hdrSize : hdrSize+n]),
		})
	})
	stop()
	_, after, cerr := d.captureCounters()
	loss := CaptureLoss{RingFull: after.RingFull - before.RingFull, RateLimited: after.RateLimited - before.RateLimited}
	return loss, errors.Join(err, cerr)
}
