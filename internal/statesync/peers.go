package statesync

import (
	"context"
	"slices"
	"strings"
	"sync"
)

// peerSet is the current list of peers: static (--sync-peer) or
// discovered (SetPeers, from the Kubernetes API). e.mu guards it.
type peerSet struct {
	list []Peer
	// known: a list was given (a discovered set is unknown until the
	// source first reports; the bootstrap waits for it).
	known bool
	// dialers stop the dial loops of the peers this node dials.
	dialers map[string]context.CancelFunc
	runCtx  context.Context
	wg      *sync.WaitGroup
}

// listed reports whether name is a current peer. e.mu held.
func (e *Engine) listed(name string) bool {
	return slices.ContainsFunc(e.peerset.list, func(p Peer) bool { return p.Name == name })
}

// SetPeers replaces the peer list: streams with peers no longer listed
// are closed, new peers dialed (by the node whose name sorts first), a
// peer whose address changed redialed.
func (e *Engine) SetPeers(peers []Peer) {
	peers = slices.DeleteFunc(slices.Clone(peers), func(p Peer) bool { return p.Name == e.cfg.Node })
	slices.SortFunc(peers, func(a, b Peer) int { return strings.Compare(a.Name, b.Name) })
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.peerset.list
	e.peerset.list, e.peerset.known = peers, true
	for _, o := range old {
		i := slices.IndexFunc(peers, func(p Peer) bool { return p.Name == o.Name })
		if i >= 0 && peers[i].Address == o.Address {
			continue
		}
		if stop := e.peerset.dialers[o.Name]; stop != nil {
			stop()
			delete(e.peerset.dialers, o.Name)
		}
		if c := e.conns[o.Name]; c != nil {
			c.cancel()
		}
		if i < 0 {
			delete(e.peers, o.Name)
			delete(e.booted, o.Name)
			e.event(EventPeerRemoved, o.Name, "", "peer removed from the peer list")
		}
	}
	for _, p := range peers {
		ps := e.peerStatusLocked(p.Name)
		ps.Address = p.Address
		e.startDialLocked(p)
	}
}

// startDialLocked starts the dial loop of p if this node dials it and
// none runs. e.mu held.
func (e *Engine) startDialLocked(p Peer) {
	if e.peerset.runCtx == nil || e.cfg.Node > p.Name || e.peerset.dialers[p.Name] != nil {
		return
	}
	ctx, cancel := context.WithCancel(e.peerset.runCtx)
	e.peerset.dialers[p.Name] = cancel
	e.peerset.wg.Go(func() { e.dialLoop(ctx, p) })
}
