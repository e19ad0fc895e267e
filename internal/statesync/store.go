// Package statesync replicates eBPF map contents between nodes: each
// node publishes the changes it makes (captured from a ring buffer of
// change records, from its own user-space writes, or by diffing a map it
// does not own), numbered per origin, over one mutually authenticated
// gRPC stream per peer; receivers apply them in order, acknowledge them,
// and resync from a snapshot when anything was lost. See
// docs/ARCHITECTURE.md, "State sync".
package statesync

import (
	"bytes"
	"encoding/binary"

	"github.com/cespare/xxhash/v2"

	"github.com/socklane/socklane/internal/syncpb"
)

// originID is an origin (node, incarnation) as a comparable value.
type originID struct {
	node        string
	incarnation uint64
}

func (o originID) proto() *syncpb.Origin {
	return &syncpb.Origin{Node: o.node, Incarnation: o.incarnation}
}

func fromProto(o *syncpb.Origin) originID {
	return originID{node: o.GetNode(), incarnation: o.GetIncarnation()}
}

// version orders the writes of one key: the higher generation wins, ties
// broken by writer, so every node that has seen the same versions holds
// the same one whatever the order they came in.
type version struct {
	gen    uint64
	writer originID
}

func (v version) newer(o version) bool {
	if v.gen != o.gen {
		return v.gen > o.gen
	}
	if v.writer.node != o.writer.node {
		return v.writer.node > o.writer.node
	}
	return v.writer.incarnation > o.writer.incarnation
}

// entry is the latest version of one key.
type entry struct {
	value   []byte
	deleted bool
	// slot is, while the entry waits in a mapWriter, its place there
	// plus one (0: it does not wait).
	slot int32
	ver  version
	// died is when a tombstone was made, in Unix nanoseconds (forgotten
	// after TombstoneTTL).
	died int64
	// epoch is the table's poll epoch when a peer's version was applied:
	// a poll that started in that epoch skips the key (its dump may
	// predate the write).
	epoch uint64
	// captured is when the writing node captured the write (for lag).
	captured int64
	// sum is a live entry's part of its writer's digest (entryHash),
	// computed when the entry is installed.
	sum uint64
	// mark is the last read of the map that found the key.
	mark uint64
}

// table is one synced map's replicated state.
type table struct {
	name    string
	schema  *syncpb.TableSchema
	entries map[string]*entry
	// writers are, by writer, the entries (and tombstones) whose latest
	// version it wrote and the digest of the live ones.
	writers map[originID]*writerState
	// last is the writer state used last (consecutive changes are
	// mostly one writer's).
	last *writerState
	// epoch counts polls of the local map.
	epoch uint64
	// nLive and nDead count entries and tombstones.
	nLive, nDead int
	// capture and captureWhy are TableStatus's.
	capture, captureWhy string
}

// writerState is what a table holds of one writer's versions.
type writerState struct {
	writer originID
	// held counts entries and tombstones.
	held int
	sum  digest
}

type digest struct {
	entries uint64
	sum     uint64
}

func newTable(name string, schema *syncpb.TableSchema) *table {
	return &table{name: name, schema: schema, entries: map[string]*entry{}, writers: map[originID]*writerState{}}
}

// entryHash is the contribution of a live entry to its writer's digest;
// it must be the same on every node (xxhash: no per-process seed).
func entryHash(key string, value []byte, v version) uint64 {
	var d xxhash.Digest
	d.Reset()
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(key)))
	_, _ = d.Write(n[:])
	_, _ = d.WriteString(key)
	_, _ = d.Write(value)
	binary.LittleEndian.PutUint64(n[:], v.gen)
	_, _ = d.Write(n[:])
	return d.Sum64()
}

// writer is w's state, made when missing.
func (t *table) writer(w originID) *writerState {
	if t.last != nil && t.last.writer == w {
		return t.last
	}
	ws := t.writers[w]
	if ws == nil {
		ws = &writerState{writer: w}
		t.writers[w] = ws
	}
	t.last = ws
	return ws
}

// held is how many entries and tombstones writer w's versions are.
func (t *table) held(w originID) int {
	if ws := t.writers[w]; ws != nil {
		return ws.held
	}
	return 0
}

// account adds (sign +1) or takes away (-1) an entry from the counts and
// its writer's digest.
func (t *table) account(e *entry, sign int) {
	if e == nil {
		return
	}
	ws := t.writer(e.ver.writer)
	ws.held += sign
	switch {
	case e.deleted:
		t.nDead += sign
	case sign > 0:
		t.nLive++
		ws.sum.entries++
		ws.sum.sum += e.sum
	default:
		t.nLive--
		ws.sum.entries--
		ws.sum.sum -= e.sum
	}
	if ws.held == 0 {
		delete(t.writers, ws.writer)
		if t.last == ws {
			t.last = nil
		}
	}
}

// merge installs e for key if it is newer than what the table holds and
// reports whether it did, and the entry it replaced.
func (t *table) merge(key string, e *entry) (*entry, bool) {
	cur := t.entries[key]
	if cur != nil && !e.ver.newer(cur.ver) {
		return cur, false
	}
	t.install(key, e, cur)
	return cur, true
}

// install puts e for key in place of cur, what the table holds for it
// (nil: nothing).
func (t *table) install(key string, e, cur *entry) {
	if !e.deleted {
		e.sum = entryHash(key, e.value, e.ver)
	}
	t.account(cur, -1)
	t.entries[key] = e
	t.account(e, +1)
}

// remove forgets a key altogether.
func (t *table) remove(key string) {
	t.account(t.entries[key], -1)
	delete(t.entries, key)
}

// differs reports whether the map's value for a key (nil: absent) is not
// what the table holds.
func (t *table) differs(key, value []byte) bool {
	return differsFrom(t.entries[string(key)], value)
}

// differsFrom reports whether value (nil: absent) is not what entry cur
// (nil: none) holds.
func differsFrom(cur *entry, value []byte) bool {
	live := cur != nil && !cur.deleted
	if value == nil {
		return live
	}
	return !live || !bytes.Equal(cur.value, value)
}
