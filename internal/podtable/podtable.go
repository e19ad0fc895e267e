// Package podtable is socklane's pod table: what each node says of its own
// pods (namespace, name, labels, named ports, by address) to the other
// nodes' network policies. The state sync replicates the table, so with it
// an agent watches only its own node's pods instead of every pod of the
// cluster: each node publishes its pods, and reads the others' from the
// table.
package podtable

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"time"

	"github.com/cilium/ebpf"
	"google.golang.org/protobuf/proto"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/policy"
	"github.com/socklane/socklane/internal/syncpb"
)

// ValueSize is the size of a table value: the record's length, then the
// record.
var ValueSize = binary.Size(datapath.PodRecord{})

// Key is the table key of a pod address.
func Key(a netip.Addr) [16]byte { return a.Unmap().As16() }

// Encode makes a table value of the record (deterministic: the same
// record always makes the same bytes, so an unchanged pod is not
// published again).
func Encode(r *syncpb.PodRecord) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encoding the record of pod %s/%s: %w", r.GetNamespace(), r.GetName(), err)
	}
	if len(b) > datapath.PodRecordData {
		return nil, fmt.Errorf("pod %s/%s: its labels and named ports take %d bytes encoded, more than the %d a pod table record holds",
			r.GetNamespace(), r.GetName(), len(b), datapath.PodRecordData)
	}
	v := make([]byte, ValueSize)
	binary.NativeEndian.PutUint32(v, uint32(len(b)))
	copy(v[4:], b)
	return v, nil
}

// Decode reads a table value, refusing one no node could have written.
func Decode(v []byte) (*syncpb.PodRecord, error) {
	if len(v) != ValueSize {
		return nil, fmt.Errorf("a pod record of %d bytes, want %d", len(v), ValueSize)
	}
	n := binary.NativeEndian.Uint32(v)
	if n > uint32(datapath.PodRecordData) {
		return nil, fmt.Errorf("a pod record claiming %d bytes, more than %d", n, datapath.PodRecordData)
	}
	r := &syncpb.PodRecord{}
	if err := proto.Unmarshal(v[4:4+n], r); err != nil {
		return nil, fmt.Errorf("decoding a pod record: %w", err)
	}
	if r.Node == "" || r.Namespace == "" || r.Name == "" {
		return nil, errors.New("a pod record without its node, namespace or name")
	}
	for _, p := range r.Ports {
		if _, err := policy.ParseProtocol(p.Protocol); err != nil || p.Port == 0 || p.Port > 65535 || p.Name == "" {
			return nil, fmt.Errorf("pod %s/%s: named port %q %d/%s is not one a pod has", r.Namespace, r.Name, p.Name, p.Port, p.Protocol)
		}
	}
	return r, nil
}

// recordOf is what node publishes of pod.
func recordOf(node string, p *policy.Pod) *syncpb.PodRecord {
	r := &syncpb.PodRecord{Node: node, Namespace: p.Namespace, Name: p.Name, Labels: p.Labels}
	for _, np := range p.Ports {
		r.Ports = append(r.Ports, &syncpb.PodPort{Name: np.Name, Port: uint32(np.Port), Protocol: np.Protocol.String()})
	}
	return r
}

// podOf is the policy model's pod of a record with its addresses.
func podOf(r *syncpb.PodRecord, ips []netip.Addr) *policy.Pod {
	p := &policy.Pod{Namespace: r.Namespace, Name: r.Name, Labels: r.Labels, IPs: ips}
	for _, np := range r.Ports {
		proto, _ := policy.ParseProtocol(np.Protocol) // checked by Decode
		p.Ports = append(p.Ports, policy.NamedPort{Name: np.Name, Port: uint16(np.Port), Protocol: proto})
	}
	return p
}

// Writer replicates a write to a synced table (the state sync's Publish).
type Writer interface {
	Publish(table string, key, value []byte) error
}

// Publisher keeps this node's pods in the table: it writes the records of
// pods that are new or changed and deletes those of pods that are gone.
// It compares with what the table holds, not with what it wrote: a key
// another node wrote since (an address now used there) is neither
// deleted nor taken for this node's.
type Publisher struct {
	w    Writer
	m    *ebpf.Map
	node string
	// held are the keys this node wrote; nil until the first Sync has
	// read what an earlier run left.
	held map[[16]byte]bool
	// missing are the nodes with records in the table that the cluster
	// did not list at the last Prune, and since when.
	missing map[string]time.Time
	// Grace is how long Prune waits for a missing node to be listed
	// again (NodeGoneGrace unless set).
	Grace time.Duration
}

// NodeGoneGrace is how long a node with records in the table must be
// missing from the cluster's nodes before Prune deletes its records: a
// node that just joined publishes its pods as soon as it runs, which
// another node's view of the cluster may not show yet.
const NodeGoneGrace = time.Minute

// NewPublisher publishes node's pods to the pod table m through w.
func NewPublisher(w Writer, m *ebpf.Map, node string) *Publisher {
	return &Publisher{w: w, m: m, node: node, missing: map[string]time.Time{}, Grace: NodeGoneGrace}
}

// Prune deletes the records of nodes the cluster has not listed for
// p.Grace (live says whether it lists a node; nodes: how many it
// lists), which nobody else would: a node that left for good deletes
// nothing, and its addresses may never be reused. With no node listed
// at all (a cluster that does not list its nodes to this agent) it
// deletes nothing. It returns the nodes whose records it deleted.
func (p *Publisher) Prune(live func(node string) bool, nodes int, now time.Time) (gone []string, err error) {
	if nodes == 0 {
		return nil, nil
	}
	byNode := map[string][][16]byte{}
	err = walk(p.m, func(k [16]byte, _ []byte, r *syncpb.PodRecord) {
		if r != nil && r.Node != p.node && !live(r.Node) {
			byNode[r.Node] = append(byNode[r.Node], k)
		}
	})
	if err != nil {
		return nil, err
	}
	for n := range p.missing {
		if _, ok := byNode[n]; !ok {
			delete(p.missing, n)
		}
	}
	var errs []error
	cur := make([]byte, ValueSize)
	for _, n := range slices.Sorted(maps.Keys(byNode)) {
		since, ok := p.missing[n]
		if !ok {
			p.missing[n] = now
			continue
		}
		if now.Sub(since) < p.Grace {
			continue
		}
		for _, k := range byNode[n] {
			if err := p.m.Lookup(datapath.PodKey{Addr: k}, cur); err != nil {
				continue // gone already
			}
			if r, err := Decode(cur); err != nil || r.Node != n {
				continue // rewritten since the walk
			}
			if err := p.w.Publish(datapath.PodTableName, k[:], nil); err != nil {
				errs = append(errs, err)
			}
		}
		delete(p.missing, n)
		gone = append(gone, n)
	}
	return gone, errors.Join(errs...)
}

// Result says what a Sync did; Refused says which pods were left out and
// why.
type Result struct {
	Put, Deleted int
	Refused      []string
}

// Sync makes the table hold pods (this node's, with their addresses) as
// this node's records, and no other record of this node.
func (p *Publisher) Sync(pods []*policy.Pod) (Result, error) {
	var res Result
	if p.held == nil {
		held := map[[16]byte]bool{}
		err := walk(p.m, func(k [16]byte, _ []byte, r *syncpb.PodRecord) {
			if r != nil && r.Node == p.node {
				held[k] = true
			}
		})
		if err != nil {
			return res, err
		}
		p.held = held
	}
	want := map[[16]byte][]byte{}
	for _, pod := range pods {
		if len(pod.IPs) == 0 {
			continue
		}
		v, err := Encode(recordOf(p.node, pod))
		if err != nil {
			res.Refused = append(res.Refused, err.Error())
			continue
		}
		for _, a := range pod.IPs {
			want[Key(a)] = v
		}
	}
	var errs []error
	cur := make([]byte, ValueSize)
	for _, k := range sortedKeys(p.held) {
		if _, ok := want[k]; ok {
			continue
		}
		delete(p.held, k)
		if err := p.m.Lookup(datapath.PodKey{Addr: k}, cur); err != nil {
			continue // gone already
		}
		if r, err := Decode(cur); err != nil || r.Node != p.node {
			continue // another node's now
		}
		if err := p.w.Publish(datapath.PodTableName, k[:], nil); err != nil {
			errs = append(errs, err)
			continue
		}
		res.Deleted++
	}
	for _, k := range sortedKeys(want) {
		v := want[k]
		p.held[k] = true
		if err := p.m.Lookup(datapath.PodKey{Addr: k}, cur); err == nil && bytes.Equal(cur, v) {
			continue
		}
		if err := p.w.Publish(datapath.PodTableName, k[:], v); err != nil {
			errs = append(errs, err)
			continue
		}
		res.Put++
	}
	return res, errors.Join(errs...)
}

// Remote reads the other nodes' pods from the table: a pod per (node,
// namespace, name) with every address it has there. Records of node
// itself are left out (this node's pods come from its own source), as
// are records that do not decode (counted in bad).
func Remote(m *ebpf.Map, node string) (pods []*policy.Pod, bad int, err error) {
	type podKey struct{ node, ns, name string }
	byPod := map[podKey]*policy.Pod{}
	err = walk(m, func(k [16]byte, _ []byte, r *syncpb.PodRecord) {
		if r == nil {
			bad++
			return
		}
		if r.Node == node {
			return
		}
		a := netip.AddrFrom16(k).Unmap()
		pk := podKey{r.Node, r.Namespace, r.Name}
		if p := byPod[pk]; p != nil {
			p.IPs = append(p.IPs, a)
			return
		}
		p := podOf(r, []netip.Addr{a})
		byPod[pk] = p
		pods = append(pods, p)
	})
	for _, p := range pods {
		slices.SortFunc(p.IPs, netip.Addr.Compare)
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Key() < pods[j].Key() })
	return pods, bad, err
}

// Read returns every record of the table by address; bad counts the
// values that do not decode.
func Read(m *ebpf.Map) (recs map[netip.Addr]*syncpb.PodRecord, bad int, err error) {
	recs = map[netip.Addr]*syncpb.PodRecord{}
	err = walk(m, func(k [16]byte, _ []byte, r *syncpb.PodRecord) {
		if r == nil {
			bad++
			return
		}
		recs[netip.AddrFrom16(k).Unmap()] = r
	})
	return recs, bad, err
}

// walk calls f with every entry of the table, r nil where the value does
// not decode.
func walk(m *ebpf.Map, f func(k [16]byte, v []byte, r *syncpb.PodRecord)) error {
	var k datapath.PodKey
	v := make([]byte, ValueSize)
	it := m.Iterate()
	for it.Next(&k, v) {
		r, err := Decode(v)
		if err != nil {
			r = nil
		}
		f(k.Addr, v, r)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading the pod table: %w", err)
	}
	return nil
}

func sortedKeys[V any](m map[[16]byte]V) [][16]byte {
	ks := make([][16]byte, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, func(a, b [16]byte) int { return slices.Compare(a[:], b[:]) })
	return ks
}
