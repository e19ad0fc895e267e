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
	"time"

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
	ver     version
	// died is when a tombstone was made (forgotten after TombstoneTTL).
	died time.Time
	// epoch is the table's poll epoch when a peer's version was applied:
	// a poll that started in that epoch skips the key (its dump may
	// predate the write).
	epoch uint64
	// captured is when the writing node captured the write (for lag).
	captured int64
	// applied is when a peer's version was applied here.
	applied time.Time
	// mark is the last read of the map that found the key.
	mark uint64
}

// table is one synced map's replicated state.
type table struct {
	name    string
	schema  *syncpb.TableSchema
	entries map[string]*entry
	// sums are the digests of the live entries by writer.
	sums map[originID]*digest
	// epoch counts polls of the local map.
	epoch uint64
	// nLive and nDead count entries and tombstones; byWriter counts
	// both by the writer of their version.
	nLive, nDead int
	byWriter     map[originID]int
}

type digest struct {
	entries uint64
	sum     uint64
}

func newTable(name string, schema *syncpb.TableSchema) *table {
	return &table{name: name, schema: schema, entries: map[string]*entry{}, sums: map[originID]*digest{}, byWriter: map[originID]int{}}
}

// entryHash is the contribution of a live entry to its writer's digest;
// it must be the same on every node (xxhash: no per-process seed).
func entryHash(key, value []byte, v version) uint64 {
	d := xxhash.New()
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(key)))
	_, _ = d.Write(n[:])
	_, _ = d.Write(key)
	_, _ = d.Write(value)
	binary.LittleEndian.PutUint64(n[:], v.gen)
	_, _ = d.Write(n[:])
	return d.Sum64()
}

func (t *table) account(key []byte, e *entry, sign int) {
	if e == nil || e.deleted {
		return
	}
	d := t.sums[e.ver.writer]
	if d == nil {
		d = &digest{}
		t.sums[e.ver.writer] = d
	}
	h := entryHash(key, e.value, e.ver)
	if sign > 0 {
		d.entries++
		d.sum += h
	} else {
		d.entries--
		d.sum -= h
	}
}

// merge installs e for key if it is newer than what the table holds and
// reports whether it did.
func (t *table) merge(key []byte, e *entry) bool {
	cur := t.entries[string(key)]
	if cur != nil && !e.ver.newer(cur.ver) {
		return false
	}
	t.account(key, cur, -1)
	t.count(cur, -1)
	t.entries[string(key)] = e
	t.account(key, e, +1)
	t.count(e, +1)
	return true
}

// count keeps nLive and nDead up to date.
func (t *table) count(e *entry, sign int) {
	if e != nil {
		t.byWriter[e.ver.writer] += sign
		if t.byWriter[e.ver.writer] == 0 {
			delete(t.byWriter, e.ver.writer)
		}
	}
	switch {
	case e == nil:
	case e.deleted:
		t.nDead += sign
	default:
		t.nLive += sign
	}
}

// remove forgets a key altogether.
func (t *table) remove(key string) {
	e := t.entries[key]
	t.account([]byte(key), e, -1)
	t.count(e, -1)
	delete(t.entries, key)
}

// live is the value a key holds, if any.
func (t *table) live(key []byte) ([]byte, bool) {
	e := t.entries[string(key)]
	if e == nil || e.deleted {
		return nil, false
	}
	return e.value, true
}

// differs reports whether the map's value for a key (nil: absent) is not
// what the table holds.
func (t *table) differs(key, value []byte) bool {
	cur, ok := t.live(key)
	if value == nil {
		return ok
	}
	return !ok || !bytes.Equal(cur, value)
}
