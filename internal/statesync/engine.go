package statesync

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/syncpb"
)

// ProtocolVersion is the version of proto/socklane/sync/v1 this node
// speaks: 2 sends entries packed by column (EntryBatch).
const ProtocolVersion = 2

// Engine is one node's state sync.
type Engine struct {
	cfg Config
	log *slog.Logger
	tls *tlsConfig

	origin originID

	mu     sync.Mutex
	clock  uint64 // Lamport clock: the highest generation seen
	rlog   *resendLog
	tables []*table
	maps   []*ebpf.Map
	// readers read given keys of each map in batches (nil: key by key).
	readers []*batchReader
	// schemaList are the tables' schemas, in order.
	schemaList []*syncpb.TableSchema
	applied    map[originID]uint64 // how far each origin's changes are applied
	conns      map[string]*conn    // live streams by peer name
	active     bool
	marks      uint64 // numbers reads of the map (entry.mark)
	// snapshotting counts snapshots coming in.
	snapshotting int
	take         takeover
	lastActive   string // the peer last heard to be active
	// recheck are, per table, keys whose read overlapped a peer's apply,
	// to be read again.
	recheck [][][]byte
	peerset peerSet
	// lastRefusal says why a peer was last refused.
	lastRefusal string
	peers       map[string]*PeerStatus
	events      *eventLog
	wake        chan struct{} // closed and replaced when the log grows
	// changed are, per table, signalled (without blocking) when a peer's
	// writes reach its map.
	changed []chan struct{}

	// bootstrapped is closed once every peer sent its snapshot, or the
	// bootstrap timeout passed.
	bootstrapped chan struct{}
	booted       map[string]bool

	stats stats
}

type stats struct {
	sent, applied, stale, resent, dropped, published atomic.Uint64
	snapshotsSent, snapshotsApplied, resyncs         atomic.Uint64
	refused, diverged, lost, polls, pollChanges      atomic.Uint64
}

// Check checks what New would, but for the maps pinned at the paths in
// later (ones the caller pins before it calls New): the settings, the
// certificates, and that every other map is pinned and can be synced.
func Check(cfg Config, later ...string) error {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	if _, err := loadTLS(cfg.Node, cfg.TLS); err != nil {
		return err
	}
	for _, t := range cfg.Tables {
		if slices.Contains(later, t.Path) {
			continue
		}
		m, err := ebpf.LoadPinnedMap(t.Path, nil)
		if err != nil {
			return fmt.Errorf("opening the map to sync %s: %w (pin it first, or fix --sync-map)", t.Path, err)
		}
		_, err = schemaOf(t.Name, m, t.Mode)
		m.Close()
		if err != nil {
			return fmt.Errorf("--sync-map %s: %w", t.Path, err)
		}
	}
	return nil
}

// New opens the pinned maps and reads the certificates; nothing runs
// until Run.
func New(cfg Config, log *slog.Logger) (*Engine, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tc, err := loadTLS(cfg.Node, cfg.TLS)
	if err != nil {
		return nil, err
	}
	var inc [8]byte
	if _, err := rand.Read(inc[:]); err != nil {
		return nil, fmt.Errorf("drawing an incarnation: %w", err)
	}
	e := &Engine{
		cfg: cfg, log: log, tls: tc,
		origin:       originID{node: cfg.Node, incarnation: binary.LittleEndian.Uint64(inc[:])},
		rlog:         newResendLog(cfg.LogSize),
		applied:      map[originID]uint64{},
		conns:        map[string]*conn{},
		peers:        map[string]*PeerStatus{},
		wake:         make(chan struct{}),
		bootstrapped: make(chan struct{}),
		booted:       map[string]bool{},
		events:       newEventLog(),
		active:       cfg.Active,
	}
	e.peerset.dialers = map[string]context.CancelFunc{}
	if !cfg.DiscoverPeers {
		e.peerset.list, e.peerset.known = slices.Clone(cfg.Peers), true
	}
	for _, p := range e.peerset.list {
		e.peers[p.Name] = &PeerStatus{Name: p.Name, Address: p.Address}
	}
	for _, t := range cfg.Tables {
		m, err := ebpf.LoadPinnedMap(t.Path, nil)
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("opening the map to sync %s: %w (pin it first, or fix --sync-map)", t.Path, err)
		}
		e.maps = append(e.maps, m)
		s, err := schemaOf(t.Name, m, t.Mode)
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("--sync-map %s: %w", t.Path, err)
		}
		e.tables = append(e.tables, newTable(t.Name, s))
		e.schemaList = append(e.schemaList, s)
		r, err := newBatchReader(m)
		if err != nil {
			log.Info("sync: reading changed keys one at a time", "table", t.Name, "reason", err)
		}
		e.readers = append(e.readers, r)
	}
	e.recheck = make([][][]byte, len(e.tables))
	for range e.tables {
		e.changed = append(e.changed, make(chan struct{}, 1))
	}
	return e, nil
}

// Changed is signalled whenever peers' writes reached table's map since
// it was last received (writes close together signal once).
func (e *Engine) Changed(table string) (<-chan struct{}, error) {
	ti := e.tableIndex(table)
	if ti < 0 {
		return nil, fmt.Errorf("no synced table %s", table)
	}
	return e.changed[ti], nil
}

// Bootstrapped is closed once every peer sent its state, or the bootstrap
// timeout passed: a user-space writer publishes only then, or the peers'
// older versions of its keys would replace what it wrote.
func (e *Engine) Bootstrapped() <-chan struct{} { return e.bootstrapped }

// Close releases the maps.
func (e *Engine) Close() {
	for _, r := range e.readers {
		r.close()
	}
	for _, m := range e.maps {
		m.Close()
	}
}

// Origin is this run's origin (node and incarnation).
func (e *Engine) Origin() (string, uint64) { return e.origin.node, e.origin.incarnation }

// publishes reports whether this node's writes to table ti are
// replicated (always in shared mode; only while active otherwise).
// e.mu held.
func (e *Engine) publishes(ti int) bool {
	return e.tables[ti].schema.GetMode() != syncpb.Mode_MODE_ACTIVE_STANDBY || e.active
}

// record makes a local write a change: a new version of the key,
// appended to the log. e.mu held.
func (e *Engine) record(ti int, key string, value []byte, deleted bool, captured int64) {
	e.recordOver(ti, key, value, deleted, captured, e.tables[ti].entries[key])
}

// recordOver is record where the caller has the entry the table holds
// for key (nil: none): a local write is the newest version, so it
// replaces that entry without a second lookup. e.mu held.
func (e *Engine) recordOver(ti int, key string, value []byte, deleted bool, captured int64, cur *entry) {
	e.clock++
	en := &entry{value: value, deleted: deleted, ver: version{gen: e.clock, writer: e.origin}, captured: captured}
	if deleted {
		en.value, en.died = nil, time.Now().UnixNano()
	}
	e.tables[ti].install(key, en, cur)
	e.rlog.append(logged{table: uint32(ti), key: key, en: en})
	e.stats.published.Add(1)
}

// notify wakes the senders after the log grew. e.mu held.
func (e *Engine) notify() {
	close(e.wake)
	e.wake = make(chan struct{})
}

// Publish writes key (value, or a delete when value is nil) to a synced
// map and replicates it: the way for a user-space writer on this node.
func (e *Engine) Publish(tableName string, key, value []byte) error {
	ti := e.tableIndex(tableName)
	if ti < 0 {
		return fmt.Errorf("no synced table %s", tableName)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.publishes(ti) {
		return fmt.Errorf("table %s: this node is a standby; only the active node writes", tableName)
	}
	m := e.maps[ti]
	var err error
	if value == nil {
		err = m.Delete(key)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			err = nil
		}
	} else {
		err = m.Put(key, value)
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", tableName, err)
	}
	e.record(ti, string(key), clone(value), value == nil, time.Now().UnixNano())
	e.notify()
	return nil
}

// schemas are the tables' schemas, in order (fixed once New returns).
func (e *Engine) schemas() []*syncpb.TableSchema { return e.schemaList }

func (e *Engine) tableIndex(name string) int {
	for i, t := range e.tables {
		if t.name == name {
			return i
		}
	}
	return -1
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}

// apply merges a peer's versions into the tables and writes those that
// win to the maps, in batches. It returns how many won. e.mu held.
// nextMark numbers a read of the map. e.mu held.
func (e *Engine) nextMark() uint64 {
	e.marks++
	return e.marks
}

// apply merges a peer's versions into the tables and writes those that
// win to the maps, in batches. It returns how many won. e.mu held.
func (e *Engine) apply(recs []rec) (int, error) {
	won := 0
	now := time.Now().UnixNano()
	w := newMapWriter(len(e.tables))
	for _, r := range recs {
		t := e.tables[r.table]
		if r.ver.gen > e.clock {
			e.clock = r.ver.gen
		}
		en := &entry{deleted: r.deleted, ver: r.ver, epoch: t.epoch, captured: r.captured}
		if en.deleted {
			en.died = now
		} else {
			en.value = clone(r.value)
		}
		cur, ok := t.merge(string(r.key), en)
		if !ok {
			e.stats.stale.Add(1)
			continue
		}
		won++
		w.replace(int(r.table), r.key, en, cur)
	}
	e.stats.applied.Add(uint64(won))
	return won, w.flush(e)
}

// snapshot takes every entry held, tombstones too, and the last change
// of this node's origin they include. It holds pointers: entries are
// never changed once made, so a snapshot is encoded while it is sent.
// e.mu held.
func (e *Engine) snapshot() ([]logged, uint64) {
	return e.snapshotRefs(), e.rlog.last
}

// appliedList is how far this node applied each origin. e.mu held.
func (e *Engine) appliedList() []*syncpb.OriginState {
	out := make([]*syncpb.OriginState, 0, len(e.applied))
	for o, s := range e.applied {
		out = append(out, &syncpb.OriginState{Origin: o.proto(), Seq: s})
	}
	return out
}

func (e *Engine) snapshotRefs() []logged {
	n := 0
	for _, t := range e.tables {
		n += len(t.entries)
	}
	out := make([]logged, 0, n)
	for ti, t := range e.tables {
		for k, en := range t.entries {
			out = append(out, logged{key: k, en: en, table: uint32(ti)})
		}
	}
	return out
}

// written lists the keys whose latest version writer wrote, by table
// (nil when there are none). e.mu held.
func (e *Engine) written(writer originID) map[int]map[string]bool {
	var out map[int]map[string]bool
	for ti, t := range e.tables {
		if t.held(writer) == 0 {
			continue
		}
		m := make(map[string]bool, t.held(writer))
		for k, en := range t.entries {
			if en.ver.writer == writer {
				m[k] = true
			}
		}
		if out == nil {
			out = map[int]map[string]bool{}
		}
		out[ti] = m
	}
	if out == nil {
		return map[int]map[string]bool{}
	}
	return out
}

// prune removes the keys writer wrote that its snapshot did not hold
// (writer dropped them: a delete whose tombstone it already forgot),
// unless another writer wrote them since. e.mu held.
func (e *Engine) prune(writer originID, gone map[int]map[string]bool) error {
	w := newMapWriter(len(e.tables))
	for ti, keys := range gone {
		t := e.tables[ti]
		for k := range keys {
			en := t.entries[k]
			if en == nil || en.ver.writer != writer {
				continue
			}
			t.remove(k)
			if !en.deleted {
				w.add(ti, []byte(k), &entry{deleted: true})
			}
		}
	}
	return w.flush(e)
}

// digests sums what this node originated, per table. e.mu held.
func (e *Engine) digests(writer originID) []*syncpb.TableDigest {
	out := make([]*syncpb.TableDigest, 0, len(e.tables))
	for ti, t := range e.tables {
		td := &syncpb.TableDigest{Table: uint32(ti)}
		if ws := t.writers[writer]; ws != nil {
			td.Entries, td.Sum = ws.sum.entries, ws.sum.sum
		}
		out = append(out, td)
	}
	return out
}

// forget drops tombstones older than the TTL.
func (e *Engine) forget(now time.Time) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, t := range e.tables {
		for k, en := range t.entries {
			if en.deleted && now.UnixNano()-en.died > int64(e.cfg.TombstoneTTL) {
				t.remove(k)
				n++
			}
		}
	}
	return n
}

// Run serves and dials the peers and captures local writes until ctx
// ends.
func (e *Engine) Run(ctx context.Context) error {
	ln, err := e.listen()
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		wg.Wait()
	}()
	errc := make(chan error, 1)
	wg.Go(func() {
		if err := e.serve(ctx, ln); err != nil {
			select {
			case errc <- err:
			default:
			}
		}
	})
	e.mu.Lock()
	e.peerset.runCtx, e.peerset.wg = ctx, &wg
	for _, p := range e.peerset.list {
		e.startDialLocked(p)
	}
	e.mu.Unlock()
	wg.Go(func() { e.bootstrap(ctx) })
	for ti := range e.tables {
		wg.Go(func() { e.capture(ctx, ti) })
	}
	wg.Go(func() { e.housekeep(ctx) })
	wg.Go(func() { e.gate(ctx) })
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

// bootstrap waits for every peer's snapshot, or the timeout; a snapshot
// still coming in when it passes is waited for.
func (e *Engine) bootstrap(ctx context.Context) {
	deadline := time.Now().Add(e.cfg.BootstrapTimeout)
	for {
		e.mu.Lock()
		booted, busy, known, peers := 0, e.snapshotting, e.peerset.known, len(e.peerset.list)
		for _, p := range e.peerset.list {
			if e.booted[p.Name] {
				booted++
			}
		}
		e.mu.Unlock()
		if known && booted >= peers {
			break
		}
		if busy == 0 && time.Now().After(deadline) {
			e.event(EventBootstrapLate, "", "", fmt.Sprintf("%d of %d peers sent their state within %v: reading the local maps anyway", booted, peers, e.cfg.BootstrapTimeout),
				"timeout", e.cfg.BootstrapTimeout, "peers_synced", booted, "peers", peers, "peer_list_known", known)
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	close(e.bootstrapped)
}

func (e *Engine) housekeep(ctx context.Context) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if n := e.forget(now); n > 0 {
				e.log.Debug("sync: tombstones forgotten", "count", n)
			}
		}
	}
}
