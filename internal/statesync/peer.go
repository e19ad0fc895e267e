package statesync

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/socklane/socklane/internal/syncpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Frames are sent in pieces of at most this many entries.
const chunkEntries = 2048

// streamWindow is the HTTP/2 flow-control window of a sync stream: one
// stream carries everything, so it gets the whole connection's window,
// large enough that a snapshot is not held back by window updates.
const streamWindow = 8 << 20

// maxFrame bounds a received frame (a chunk of at most chunkEntries
// entries of keys and values up to a few hundred bytes).
const maxFrame = 64 << 20

// maxRedial bounds the wait between two dials of a peer that is down.
const maxRedial = 500 * time.Millisecond

// connectTimeout bounds one attempt to reach a peer (TCP and TLS). A
// connect whose SYNs a partition drops would otherwise wait on the
// kernel's SYN retransmissions (1, 3, 7, 15 s) and gRPC's 20 s default:
// a partition that heals would be noticed up to 8 s late.
const connectTimeout = 3 * time.Second

// idleTimeout ends a stream that received nothing (not even a
// heartbeat) for this long: a partition, or a peer that hangs.
const idleTimeout = 4 * heartbeatInterval

// stream is either end of the Exchange RPC.
type stream interface {
	send(*syncpb.Frame) error
	recv() (*syncpb.Frame, error)
}

type serverStream struct {
	s grpc.BidiStreamingServer[syncpb.ExchangeRequest, syncpb.ExchangeResponse]
}

func (s serverStream) send(f *syncpb.Frame) error {
	return s.s.Send(&syncpb.ExchangeResponse{Frame: f})
}

func (s serverStream) recv() (*syncpb.Frame, error) {
	r, err := s.s.Recv()
	return r.GetFrame(), err
}

type clientStream struct {
	s grpc.BidiStreamingClient[syncpb.ExchangeRequest, syncpb.ExchangeResponse]
}

func (s clientStream) send(f *syncpb.Frame) error {
	return s.s.Send(&syncpb.ExchangeRequest{Frame: f})
}

func (s clientStream) recv() (*syncpb.Frame, error) {
	r, err := s.s.Recv()
	return r.GetFrame(), err
}

// server is the gRPC service.
type server struct {
	syncpb.UnimplementedSyncServiceServer
	e   *Engine
	ctx context.Context
}

func (s *server) Exchange(st grpc.BidiStreamingServer[syncpb.ExchangeRequest, syncpb.ExchangeResponse]) error {
	p, ok := peer.FromContext(st.Context())
	if !ok {
		return errors.New("no peer")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return errors.New("no client certificate")
	}
	ids := identities(info.State.PeerCertificates[0])
	name := ""
	s.e.mu.Lock()
	for _, id := range ids {
		if s.e.listed(id) {
			name = id
		}
	}
	s.e.mu.Unlock()
	if name == "" {
		why := fmt.Sprintf("certificate names %v, no listed peer", ids)
		s.e.refusedPeer(why)
		_ = serverStream{st}.send(&syncpb.Frame{Body: &syncpb.Frame_Refusal{Refusal: &syncpb.Refusal{Reason: why}}})
		return errors.New(why)
	}
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	go func() {
		select {
		case <-st.Context().Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	return s.e.runConn(ctx, name, serverStream{st})
}

func (e *Engine) listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", e.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("--sync-listen %s: %w (choose a free address)", e.cfg.Listen, err)
	}
	return ln, nil
}

func (e *Engine) serve(ctx context.Context, ln net.Listener) error {
	e.tls.refused = e.refusedPeer
	gs := grpc.NewServer(grpc.Creds(countingCreds{credentials.NewTLS(e.tls.server()), e}),
		grpc.InitialWindowSize(streamWindow), grpc.InitialConnWindowSize(streamWindow), grpc.MaxRecvMsgSize(maxFrame))
	syncpb.RegisterSyncServiceServer(gs, &server{e: e, ctx: ctx})
	go func() {
		<-ctx.Done()
		gs.Stop()
	}()
	if err := gs.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serving the sync: %w", err)
	}
	return nil
}

// countingCreds counts the handshakes that fail on this side, and those
// that the peer broke off because it refused this node's certificate.
type countingCreds struct {
	credentials.TransportCredentials
	e *Engine
}

func (c countingCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil && !strings.Contains(err.Error(), "not signed by the sync CA") {
		c.e.refusedPeer(fmt.Sprintf("TLS handshake with %s failed: %v", raw.RemoteAddr(), err))
	}
	return conn, info, err
}

func (e *Engine) refusedPeer(reason string) {
	e.stats.refused.Add(1)
	e.mu.Lock()
	e.lastRefusal = reason
	e.mu.Unlock()
	e.event(EventPeerRefused, "", "", "peer refused: "+reason)
}

// dialLoop keeps one stream to p open.
func (e *Engine) dialLoop(ctx context.Context, p Peer) {
	backoff := redialInterval
	for ctx.Err() == nil {
		start := time.Now()
		err := e.dial(ctx, p)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > 5*time.Second {
			backoff = redialInterval
		}
		e.setPeerError(p.Name, err)
		e.log.Debug("sync: stream ended", "peer", p.Name, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxRedial)
	}
}

func (e *Engine) dial(ctx context.Context, p Peer) error {
	cc, err := grpc.NewClient(p.Address, grpc.WithTransportCredentials(credentials.NewTLS(e.tls.client(p.Name))),
		grpc.WithInitialWindowSize(streamWindow), grpc.WithInitialConnWindowSize(streamWindow),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxFrame)),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: redialInterval, Multiplier: 2, Jitter: 0.2, MaxDelay: maxRedial},
			MinConnectTimeout: connectTimeout,
		}))
	if err != nil {
		return fmt.Errorf("dialing %s: %w", p.Address, err)
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := syncpb.NewSyncServiceClient(cc).Exchange(ctx)
	if err != nil {
		return fmt.Errorf("opening the stream to %s: %w", p.Address, err)
	}
	return e.runConn(ctx, p.Name, clientStream{st})
}

// conn is one live stream with a peer.
type conn struct {
	e      *Engine
	peer   string
	st     stream
	remote originID
	cancel context.CancelFunc

	mu          sync.Mutex
	kick        chan struct{}
	ackDue      bool
	resync      syncpb.ResyncRequest_Reason
	snapshotDue bool
	cursor      uint64 // this node's changes sent up to
	lastRecv    time.Time

	// receiving
	awaiting bool // dropping changes until the snapshot asked for
	// peerApplied is how far the peer applied each origin, and peerSeq
	// the peer's own last change this node heard of (e.mu).
	peerApplied   map[originID]uint64
	peerSeq       uint64
	lastHeartbeat time.Time
	// candidates are, while a snapshot comes in, the keys the peer
	// wrote that it has not brought yet (nil: no snapshot coming in).
	candidates map[int]map[string]bool
	snapStart  time.Time
	mismatches int
}

func (c *conn) poke() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (e *Engine) hello() *syncpb.Hello {
	e.mu.Lock()
	defer e.mu.Unlock()
	h := &syncpb.Hello{Protocol: ProtocolVersion, Node: e.cfg.Node, Origin: e.origin.proto(), Active: e.active}
	for _, t := range e.tables {
		h.Tables = append(h.Tables, t.schema)
	}
	for o, s := range e.applied {
		h.Applied = append(h.Applied, &syncpb.OriginState{Origin: o.proto(), Seq: s})
	}
	return h
}

// checkHello refuses a peer that speaks another protocol, is not who its
// certificate says, or whose tables differ.
func (e *Engine) checkHello(peer string, h *syncpb.Hello) error {
	if h.GetProtocol() != ProtocolVersion {
		return fmt.Errorf("peer %s speaks sync protocol %d, this node %d", peer, h.GetProtocol(), ProtocolVersion)
	}
	if h.GetNode() != peer {
		return fmt.Errorf("peer says it is %s, its certificate says %s", h.GetNode(), peer)
	}
	if h.GetOrigin().GetNode() != peer {
		return fmt.Errorf("peer %s sends changes as %s", peer, h.GetOrigin().GetNode())
	}
	if len(h.GetTables()) != len(e.tables) {
		return fmt.Errorf("peer %s syncs %d tables, this node %d: give every node the same --sync-map list", peer, len(h.GetTables()), len(e.tables))
	}
	for i, t := range e.tables {
		theirs := h.GetTables()[i]
		if theirs.GetName() != t.name {
			return fmt.Errorf("peer %s's table %d is %s, here %s: give every node the same --sync-map list, in the same order", peer, i, theirs.GetName(), t.name)
		}
		if err := compareSchemas(t.schema, theirs); err != nil {
			return fmt.Errorf("peer %s: %w", peer, err)
		}
	}
	return nil
}

func (e *Engine) runConn(ctx context.Context, peer string, st stream) (err error) {
	defer func() {
		if err != nil && ctx.Err() == nil {
			e.setPeerError(peer, err)
		}
	}()
	if err := st.send(&syncpb.Frame{Body: &syncpb.Frame_Hello{Hello: e.hello()}}); err != nil {
		return fmt.Errorf("sending hello to %s: %w", peer, err)
	}
	f, rerr := st.recv()
	if rerr != nil {
		return fmt.Errorf("waiting for %s's hello: %w", peer, rerr)
	}
	if r := f.GetRefusal(); r != nil {
		e.stats.refused.Add(1)
		e.event(EventPeerRefused, peer, "", "the peer refused this node: "+r.GetReason())
		return fmt.Errorf("peer %s refused this node: %s", peer, r.GetReason())
	}
	h := f.GetHello()
	if h == nil {
		return fmt.Errorf("peer %s sent no hello", peer)
	}
	if err := e.checkHello(peer, h); err != nil {
		e.refusedPeer(err.Error())
		_ = st.send(&syncpb.Frame{Body: &syncpb.Frame_Refusal{Refusal: &syncpb.Refusal{Reason: err.Error()}}})
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c := &conn{e: e, peer: peer, st: st, remote: fromProto(h.GetOrigin()), cancel: cancel, kick: make(chan struct{}, 1), lastRecv: time.Now()}
	e.mu.Lock()
	if old := e.conns[peer]; old != nil {
		old.cancel()
	}
	e.conns[peer] = c
	c.snapshotDue = true
	c.peerApplied = map[originID]uint64{}
	for _, a := range h.GetApplied() {
		c.peerApplied[fromProto(a.GetOrigin())] = a.GetSeq()
	}
	for _, a := range h.GetApplied() {
		if fromProto(a.GetOrigin()) != e.origin {
			continue
		}
		if e.rlog.holds(a.GetSeq()) {
			c.cursor, c.snapshotDue = a.GetSeq(), false
		} else {
			// The peer had this run's changes up to a point the log no
			// longer holds.
			e.stats.resyncs.Add(1)
			e.noteResyncLocked(peer, fmt.Sprintf("log overflow: the peer had changes up to %d, the resend log holds them from %d", a.GetSeq(), e.rlog.first))
		}
	}
	if c.snapshotDue {
		c.awaiting = false
	}
	ps := e.peerStatusLocked(peer)
	ps.Connected, ps.Since, ps.Err, ps.Origin = true, time.Now(), "", fmt.Sprintf("%s/%016x", c.remote.node, c.remote.incarnation)
	ps.Active = h.GetActive()
	if ps.Active {
		e.lastActive = peer
	}
	e.mu.Unlock()
	e.event(EventPeerConnected, peer, "", fmt.Sprintf("peer connected (incarnation %016x)", c.remote.incarnation), "snapshot", c.snapshotDue, "resend_from", c.cursor)
	defer func() {
		e.mu.Lock()
		if c.candidates != nil {
			c.candidates = nil
			e.snapshotting--
		}
		if e.conns[peer] == c {
			delete(e.conns, peer)
			e.peerStatusLocked(peer).Connected = false
		}
		e.mu.Unlock()
	}()
	errc := make(chan error, 2)
	go func() { errc <- c.sendLoop(ctx) }()
	go func() { errc <- c.recvLoop(ctx) }()
	go c.watchdog(ctx)
	err = <-errc
	cancel()
	return err
}

// watchdog ends a stream that went silent.
func (c *conn) watchdog(ctx context.Context) {
	t := time.NewTicker(heartbeatInterval / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.mu.Lock()
			silent := time.Since(c.lastRecv)
			c.mu.Unlock()
			if silent > idleTimeout {
				c.e.event(EventPeerSilent, c.peer, "", fmt.Sprintf("nothing heard for %v: closing the stream", silent.Round(time.Millisecond)))
				c.cancel()
				return
			}
		}
	}
}
