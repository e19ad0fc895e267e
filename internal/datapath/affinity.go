package datapath

import (
	"fmt"
	"time"

	"github.com/cilium/ebpf"
)

// Affinity is one ClientIP affinity entry: a client network namespace's
// backend for a frontend, and who was charged for it.
type Affinity struct {
	Netns    uint64        `json:"netns"`
	Frontend uint32        `json:"frontend_id"`
	Owner    uint64        `json:"owner"`
	Idle     time.Duration `json:"idle_ns"`
}

// Affinities lists the affinity entries (read for tests and status).
func (d *Datapath) Affinities() ([]Affinity, error) {
	now, err := monotonicNow()
	if err != nil {
		return nil, err
	}
	all, err := readAll[servicelbSlAffinityKey, servicelbSlAffinity](d.lb.SlSvcAffinity)
	if err != nil {
		return nil, fmt.Errorf("reading affinity: %w", err)
	}
	out := make([]Affinity, 0, len(all))
	for k, v := range all {
		out = append(out, Affinity{Netns: k.Netns, Frontend: k.Id, Owner: v.Owner, Idle: time.Duration(now - v.LastNs)})
	}
	return out, nil
}

// ExpireAffinity removes the affinity entries unused for longer than
// their frontend's timeout, and those of frontends gone or no longer
// affine, returning their charges to their owners; it returns how many
// it removed. An entry used meanwhile stays (sl_lb_affinity_expire
// compares its last use).
func (d *Datapath) ExpireAffinity() (int, error) {
	timeouts := map[uint32]uint64{}
	var k servicelbSlSvcKey
	var v servicelbSlSvcVal
	it := d.lb.SlSvc.Iterate()
	for it.Next(&k, &v) {
		timeouts[v.Id] = uint64(v.AffinityS) * uint64(time.Second)
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("reading services: %w", err)
	}
	now, err := monotonicNow()
	if err != nil {
		return 0, err
	}
	all, err := readAll[servicelbSlAffinityKey, servicelbSlAffinity](d.lb.SlSvcAffinity)
	if err != nil {
		return 0, fmt.Errorf("reading affinity: %w", err)
	}
	n := 0
	for key, a := range all {
		if t, ok := timeouts[key.Id]; ok && t > 0 && now-a.LastNs < t {
			continue
		}
		ret, err := d.lb.SlLbAffinityExpire.Run(&ebpf.RunOptions{Context: servicelbSlLbAffinityArgs{Key: key, LastNs: a.LastNs}})
		if err != nil {
			return n, fmt.Errorf("expiring affinity: %w", err)
		}
		n += int(ret)
	}
	return n, nil
}
