package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
)

// Reserved classes and identities; the datapath's C enums have the same
// values (a test there holds them equal).
const (
	ClassWorld    uint32 = 0
	ClassAny      uint32 = 0xffffffff
	IdentityWorld uint32 = 0
	IdentityHost  uint32 = 1
	IdentityPods  uint32 = 256
)

// Entry is what an address, or a local pod's cgroup, is to the datapath.
type Entry struct {
	// Class is the peer class of the address (for a cgroup: of the
	// pod's IPv4 address; Class6 of its IPv6 one): addresses of one
	// class are named by exactly the same rules.
	Class, Class6 uint32
	Identity      uint32
	// Endpoint is the local endpoint id of a pod of this node (0: none),
	// isolated per direction; Policy names a policy isolating it.
	Endpoint uint32
	Isolated [2]bool
	Policy   [2]uint32
}

// IPEntry is an address or prefix.
type IPEntry struct {
	Prefix netip.Prefix
	Entry
}

// CgroupEntry is a local pod's cgroup.
type CgroupEntry struct {
	ID uint64
	Entry
}

// RuleEntry allows Endpoint traffic in direction Dir with peers of Class
// (ClassAny: every peer) on Protocol (0: every protocol and port) and
// the ports whose leading Bits bits equal Port's.
type RuleEntry struct {
	Endpoint uint32
	Dir      Direction
	Class    uint32
	Protocol Protocol
	Port     uint16
	Bits     uint8
	Policy   uint32
}

// Tables is a compiled Set, as the datapath looks it up.
type Tables struct {
	IPs     []IPEntry
	Cgroups []CgroupEntry
	Rules   []RuleEntry
	// IDs numbers the policies (counters, events); ids of a previous
	// compile are kept for the same policies.
	IDs map[string]uint32
	// Identities names each identity (namespace and labels).
	Identities map[uint32]string
}

// MaxPolicies bounds the policy ids (the datapath's counter array).
const MaxPolicies = 65535

// class is an equivalence class of addresses.
type class struct {
	id       uint32
	identity uint32
	pod      *Pod   // a pod of the class (same namespace, labels and ports as all), nil for non-pods
	blocks   []bool // per block of the set: whether the class's addresses are in it
}

type compiler struct {
	set      *Set
	nsLabels map[string]labels.Set
	blocks   []*Block
	blockIdx map[string]int // Block.String() -> index in blocks
	classes  []*class
	byKey    map[string]*class
	ids      map[string]uint32
	out      *Tables
	// Indexes for the rules: pod classes by namespace, and the classes
	// in each block.
	byNS    map[string][]*class
	inBlock [][]*class
}

// Compile turns the set into tables. prev, if not nil, are the ids a
// previous compile gave; a policy keeps its id.
func Compile(s *Set, prev map[string]uint32) (*Tables, error) {
	s.sort()
	c := &compiler{set: s, nsLabels: s.namespaceLabels(), byKey: map[string]*class{}, blockIdx: map[string]int{},
		out: &Tables{IDs: map[string]uint32{}, Identities: map[uint32]string{IdentityWorld: "world", IdentityHost: "host"}}}
	if err := c.number(prev); err != nil {
		return nil, err
	}
	for _, pol := range s.Policies {
		for d := range 2 {
			for _, r := range pol.Rules[d] {
				for _, p := range r.Peers {
					if p.Block == nil {
						continue
					}
					if _, ok := c.blockIdx[p.Block.String()]; !ok {
						c.blockIdx[p.Block.String()] = len(c.blocks)
						c.blocks = append(c.blocks, p.Block)
					}
				}
			}
		}
	}
	identities := c.identities()
	// Prefixes of the blocks: an address's longest match among them
	// decides which blocks hold it.
	prefixes := map[netip.Prefix]bool{}
	for _, b := range c.blocks {
		prefixes[b.CIDR] = true
		for _, e := range b.Except {
			prefixes[e] = true
		}
	}
	for _, p := range sortedPrefixes(prefixes) {
		in := make([]bool, len(c.blocks))
		for i, b := range c.blocks {
			in[i] = b.covers(p)
		}
		cl := c.classOf(IdentityWorld, nil, in)
		c.out.IPs = append(c.out.IPs, IPEntry{Prefix: p, Entry: Entry{Class: cl.id, Identity: IdentityWorld}})
	}
	for _, a := range s.Host {
		cl := c.classOf(IdentityHost, nil, c.blocksOf(a))
		c.out.IPs = append(c.out.IPs, IPEntry{Prefix: netip.PrefixFrom(a, a.BitLen()), Entry: Entry{Class: cl.id, Identity: IdentityHost}})
	}
	// Endpoints: the pods of this node.
	var eps []*Pod
	entries := map[*Pod]*Entry{}
	for _, p := range s.Pods {
		e := &Entry{Identity: identities[p]}
		if p.Local() {
			eps = append(eps, p)
			e.Endpoint = uint32(len(eps))
			for _, pol := range s.Policies {
				if !pol.Selects(p) {
					continue
				}
				for d := range 2 {
					if pol.Isolates[d] && !e.Isolated[d] {
						e.Isolated[d] = true
						e.Policy[d] = c.ids[pol.Key()]
					}
				}
			}
		}
		entries[p] = e
		for _, a := range p.IPs {
			cl := c.classOf(e.Identity, p, c.blocksOf(a))
			ip := IPEntry{Prefix: netip.PrefixFrom(a, a.BitLen()), Entry: *e}
			ip.Class = cl.id
			c.out.IPs = append(c.out.IPs, ip)
			if a.Is4() && e.Class == 0 {
				e.Class = cl.id
			} else if a.Is6() && e.Class6 == 0 {
				e.Class6 = cl.id
			}
		}
	}
	c.index()
	for _, p := range eps {
		e := entries[p]
		c.out.Cgroups = append(c.out.Cgroups, CgroupEntry{ID: p.CgroupID, Entry: *e})
		for d := range 2 {
			if e.Isolated[d] {
				c.rules(p, e.Endpoint, Direction(d))
			}
		}
	}
	c.out.Rules = dedupRules(c.out.Rules)
	return c.out, nil
}

// number gives every policy an id: its previous one, else the lowest free.
func (c *compiler) number(prev map[string]uint32) error {
	if len(c.set.Policies) > MaxPolicies {
		return fmt.Errorf("%d policies: at most %d", len(c.set.Policies), MaxPolicies)
	}
	c.ids = c.out.IDs
	used := map[uint32]bool{}
	for _, pol := range c.set.Policies {
		if id, ok := prev[pol.Key()]; ok && id > 0 && id <= MaxPolicies && !used[id] {
			c.ids[pol.Key()] = id
			used[id] = true
		}
	}
	next := uint32(1)
	for _, pol := range c.set.Policies {
		if _, ok := c.ids[pol.Key()]; ok {
			continue
		}
		for used[next] {
			next++
		}
		c.ids[pol.Key()] = next
		used[next] = true
	}
	return nil
}

// identities numbers each (namespace, namespace labels, pod labels).
func (c *compiler) identities() map[*Pod]uint32 {
	keys := map[string][]*Pod{}
	for _, p := range c.set.Pods {
		k := p.Namespace + "\x00" + c.nsLabels[p.Namespace].String() + "\x00" + labels.Set(p.Labels).String()
		keys[k] = append(keys[k], p)
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	slices.Sort(sorted)
	out := map[*Pod]uint32{}
	for i, k := range sorted {
		id := IdentityPods + uint32(i)
		p := keys[k][0]
		c.out.Identities[id] = p.Namespace + " {" + labels.Set(p.Labels).String() + "}"
		for _, p := range keys[k] {
			out[p] = id
		}
	}
	return out
}

func (c *compiler) blocksOf(a netip.Addr) []bool {
	in := make([]bool, len(c.blocks))
	for i, b := range c.blocks {
		in[i] = b.Contains(a)
	}
	return in
}

// classOf returns the class of addresses with this identity, pod (its
// named ports) and block membership, made on first use. Addresses that
// nothing names are the world class.
func (c *compiler) classOf(identity uint32, pod *Pod, in []bool) *class {
	var k strings.Builder
	k.WriteString(strconv.FormatUint(uint64(identity), 10))
	k.WriteByte('|')
	for _, b := range in {
		if b {
			k.WriteByte('1')
		} else {
			k.WriteByte('0')
		}
	}
	if pod != nil {
		for _, np := range pod.Ports {
			fmt.Fprintf(&k, "|%s=%d/%d", np.Name, np.Port, np.Protocol)
		}
	}
	if cl, ok := c.byKey[k.String()]; ok {
		return cl
	}
	cl := &class{identity: identity, pod: pod, blocks: in}
	if identity != IdentityWorld || slices.Contains(in, true) {
		cl.id = uint32(len(c.classes) + 1)
		c.classes = append(c.classes, cl)
	}
	c.byKey[k.String()] = cl
	return cl
}

// index groups the classes by namespace (pod classes) and by block.
func (c *compiler) index() {
	c.byNS = map[string][]*class{}
	c.inBlock = make([][]*class, len(c.blocks))
	for _, cl := range c.classes {
		if cl.pod != nil {
			c.byNS[cl.pod.Namespace] = append(c.byNS[cl.pod.Namespace], cl)
		}
		for i, in := range cl.blocks {
			if in {
				c.inBlock[i] = append(c.inBlock[i], cl)
			}
		}
	}
}

// peerClasses adds to seen the classes peer names for a policy of
// namespace ns, in class order of first sight (out).
func (c *compiler) peerClasses(ns string, peer *Peer, seen map[*class]bool, out []*class) []*class {
	add := func(cl *class) {
		if !seen[cl] {
			seen[cl] = true
			out = append(out, cl)
		}
	}
	if peer.Block != nil {
		for _, cl := range c.inBlock[c.blockIdx[peer.Block.String()]] {
			add(cl)
		}
		return out
	}
	namespaces := []string{ns}
	if peer.Namespaces != nil {
		namespaces = namespaces[:0]
		for name, l := range c.nsLabels {
			if peer.Namespaces.Matches(l) {
				namespaces = append(namespaces, name)
			}
		}
		slices.Sort(namespaces)
	}
	for _, name := range namespaces {
		for _, cl := range c.byNS[name] {
			if peer.Pods == nil || peer.Pods.Matches(labels.Set(cl.pod.Labels)) {
				add(cl)
			}
		}
	}
	return out
}

// rules emits the allow entries of endpoint ep (pod p) in direction d.
func (c *compiler) rules(p *Pod, ep uint32, d Direction) {
	for _, pol := range c.set.Policies {
		if !pol.Isolates[d] || !pol.Selects(p) {
			continue
		}
		id := c.ids[pol.Key()]
		for _, r := range pol.Rules[d] {
			var peers []*class // nil: every peer
			if len(r.Peers) > 0 {
				peers = []*class{}
				seen := map[*class]bool{}
				for i := range r.Peers {
					peers = c.peerClasses(pol.Namespace, &r.Peers[i], seen, peers)
				}
			}
			emit := func(cl *class, proto Protocol, lo, hi uint16) {
				classID := ClassAny
				if cl != nil {
					classID = cl.id
				}
				if proto == 0 {
					c.out.Rules = append(c.out.Rules, RuleEntry{Endpoint: ep, Dir: d, Class: classID, Policy: id})
					return
				}
				for _, b := range portBlocks(lo, hi) {
					c.out.Rules = append(c.out.Rules, RuleEntry{Endpoint: ep, Dir: d, Class: classID, Protocol: proto, Port: b.port, Bits: b.bits, Policy: id})
				}
			}
			forPeers := func(fn func(cl *class)) {
				if peers == nil {
					fn(nil)
					return
				}
				for _, cl := range peers {
					fn(cl)
				}
			}
			if len(r.Ports) == 0 {
				forPeers(func(cl *class) { emit(cl, 0, 0, 0) })
				continue
			}
			for _, pt := range r.Ports {
				switch {
				case pt.Name != "" && d == Ingress:
					if n, ok := p.port(pt.Name, pt.Protocol); ok {
						forPeers(func(cl *class) { emit(cl, pt.Protocol, n, n) })
					}
				case pt.Name != "":
					// Named on the peer: only pods have names.
					targets := peers
					if targets == nil {
						targets = c.classes
					}
					for _, cl := range targets {
						if cl.pod == nil {
							continue
						}
						if n, ok := cl.pod.port(pt.Name, pt.Protocol); ok {
							emit(cl, pt.Protocol, n, n)
						}
					}
				case pt.Port == 0:
					forPeers(func(cl *class) { emit(cl, pt.Protocol, 0, 0xffff) })
				default:
					hi := max(pt.End, pt.Port)
					forPeers(func(cl *class) { emit(cl, pt.Protocol, pt.Port, hi) })
				}
			}
		}
	}
}

type portBlock struct {
	port uint16
	bits uint8
}

// portBlocks covers [lo, hi] with aligned power-of-two blocks.
func portBlocks(lo, hi uint16) []portBlock {
	var out []portBlock
	for l := uint32(lo); l <= uint32(hi); {
		size := uint32(1)
		bits := uint8(16)
		for bits > 0 && l%(size*2) == 0 && l+size*2-1 <= uint32(hi) {
			size *= 2
			bits--
		}
		out = append(out, portBlock{port: uint16(l), bits: bits})
		l += size
	}
	return out
}

func sortedPrefixes(m map[netip.Prefix]bool) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(m))
	for p := range m {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return out
}

// dedupRules keeps the first entry of each key (an allow is an allow).
func dedupRules(in []RuleEntry) []RuleEntry {
	type key struct {
		ep, class uint32
		dir       Direction
		proto     Protocol
		port      uint16
		bits      uint8
	}
	seen := map[key]bool{}
	out := in[:0]
	for _, r := range in {
		k := key{r.Endpoint, r.Class, r.Dir, r.Protocol, r.Port, r.Bits}
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, r)
	}
	return out
}
