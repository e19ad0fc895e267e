package agent

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/ebpf"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/podtable"
	"github.com/socklane/socklane/internal/policy"
	"github.com/socklane/socklane/internal/statesync"
)

// syncedPods is the kube policy source's view of the other nodes' pods
// through the state sync's pod table (--sync-pods), where it publishes
// this node's.
type syncedPods struct {
	e       *statesync.Engine
	m       *ebpf.Map
	node    string
	pub     *podtable.Publisher
	changed chan struct{}
	log     *slog.Logger
	// refused are the pods last left out of the table, so that each is
	// logged once.
	refused map[string]bool
}

// newSyncedPods opens the pod table of the datapath pinned in pinDir; the
// engine must sync it. It runs until ctx ends.
func newSyncedPods(ctx context.Context, e *statesync.Engine, pinDir, node string, grace time.Duration, log *slog.Logger) (*syncedPods, error) {
	m, err := ebpf.LoadPinnedMap(datapath.PodTablePin(pinDir), nil)
	if err != nil {
		return nil, fmt.Errorf("opening the pod table: %w", err)
	}
	applied, err := e.Changed(datapath.PodTableName)
	if err != nil {
		m.Close()
		return nil, err
	}
	s := &syncedPods{e: e, m: m, node: node, pub: podtable.NewPublisher(e, m, node), changed: make(chan struct{}, 1),
		log: log, refused: map[string]bool{}}
	if grace > 0 {
		s.pub.Grace = grace
	}
	go func() {
		// The first publish waits for the peers' state (Publish skips
		// until then); the bootstrap's end asks for it.
		boot := e.Bootstrapped()
		for {
			select {
			case <-ctx.Done():
				return
			case <-boot:
				boot = nil
			case <-applied:
			}
			select {
			case s.changed <- struct{}{}:
			default:
			}
		}
	}()
	return s, nil
}

func (s *syncedPods) close() { s.m.Close() }

// Publish writes this node's pods to the table once the sync has its
// peers' state.
func (s *syncedPods) Publish(local []*policy.Pod) error {
	select {
	case <-s.e.Bootstrapped():
	default:
		return nil
	}
	res, err := s.pub.Sync(local)
	now := map[string]bool{}
	for _, why := range res.Refused {
		now[why] = true
		if !s.refused[why] {
			s.log.Warn("pod left out of the pod table: other nodes see its address as no pod's", "reason", why)
		}
	}
	s.refused = now
	if res.Put+res.Deleted > 0 {
		s.log.Debug("pod table published", "written", res.Put, "deleted", res.Deleted)
	}
	return err
}

// Pods are the other nodes' pods in the table.
func (s *syncedPods) Pods() ([]*policy.Pod, error) {
	pods, bad, err := podtable.Remote(s.m, s.node)
	if bad > 0 {
		s.log.Warn("pod table records that do not decode, left out", "records", bad)
	}
	return pods, err
}

// Prune deletes the records of nodes the cluster has stopped listing
// (after the publisher's grace) once the sync has its peers' state.
func (s *syncedPods) Prune(live func(node string) bool, nodes int) (bool, error) {
	select {
	case <-s.e.Bootstrapped():
	default:
		return false, nil
	}
	gone, err := s.pub.Prune(live, nodes, time.Now())
	if len(gone) > 0 {
		s.log.Info("pod table: records of nodes the cluster no longer lists deleted", "nodes", gone)
	}
	return len(gone) > 0, err
}

// Changed is signalled when peers wrote the table, and when the sync has
// its peers' state (this node's pods can be published).
func (s *syncedPods) Changed() <-chan struct{} { return s.changed }

// Ready is closed once the sync has its peers' state (or gave up waiting
// for it): the table holds what they published.
func (s *syncedPods) Ready() <-chan struct{} { return s.e.Bootstrapped() }
