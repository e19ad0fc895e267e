package datapath

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/cgroups"
	"github.com/socklane/socklane/internal/policy"
)

// polLinkPrefix names the pinned links of the policy's packet hook: it
// runs for every packet its cgroups receive, so it is attached to pod
// cgroups only while a policy needs it there (policyTargets), not to the
// datapath's attachments.
const polLinkPrefix = "pollink_"

// legacyPolHook is the packet hook's name among the attachments' links
// (link_polingress_<id>) in builds that attached it to every attached
// cgroup; such links are detached at the next apply.
const legacyPolHook = "polingress"

// policyHooks is the policy's packet hook: sl_pol_ingress judges a TCP
// connection's SYN into an ingress-isolated pod and an unconnected UDP
// flow's first datagram, and records at the receiver the exchange that
// lets its answers out (past its own egress policy and the sender's
// ingress policy, both judged at its sendmsg).
var policyHooks = []hook{{"ingress", ebpf.AttachCGroupInetIngress, func(d *Datapath) *ebpf.Program { return d.lb.SlPolIngress }}}

// policyTargets are the cgroups (id -> path) of the pods the packet hook
// must run in under t. While any pod is isolated for ingress, every pod
// is: any of them may receive a datagram from an isolated pod and answer
// it, and the answer is judged against the isolated pod's ingress at the
// answering pod's sendmsg unless the hook recorded the exchange. Without
// ingress isolation, only pods isolated for egress need it (their own
// answers); with no isolation at all, none. A pod whose cgroup is gone is
// left out: none of its processes can receive a packet.
func policyTargets(t *policy.Tables) (map[uint64]string, error) {
	anyIngress := false
	for _, c := range t.Cgroups {
		anyIngress = anyIngress || c.Isolated[policy.Ingress]
	}
	want := map[uint64]string{}
	var root string
	for _, c := range t.Cgroups {
		if c.ID == 0 || !anyIngress && !c.Isolated[policy.Egress] {
			continue
		}
		if root == "" {
			r, err := cgroups.Root()
			if err != nil {
				return nil, err
			}
			root = r
		}
		path, err := cgroups.PathOf(root, c.ID)
		if errors.Is(err, cgroups.ErrGone) {
			continue
		}
		if err != nil {
			return nil, err
		}
		want[c.ID] = path
	}
	return want, nil
}

// PolicyTargets lists the cgroups the policy's packet hook is attached to.
func (d *Datapath) PolicyTargets() ([]uint64, error) {
	return Pins(d.cfg.PinDir).targets(polLinkPrefix)
}

// dropLegacyPolHooks detaches the packet hook from the attachments of a
// build that attached it to all of them.
func (d *Datapath) dropLegacyPolHooks() error {
	ls, err := Pins(d.cfg.PinDir).links()
	if err != nil {
		return err
	}
	for _, hs := range ls {
		if pin, ok := hs[legacyPolHook]; ok {
			if _, err := detachPin(pin); err != nil {
				return err
			}
		}
	}
	return nil
}

// PolicyStats is what an apply of network policy wrote.
type PolicyStats struct {
	Policies  int    `json:"policies"`
	Addresses int    `json:"addresses"`
	Cgroups   int    `json:"cgroups"`
	Rules     int    `json:"rules"`
	Bank      uint32 `json:"bank"`
	// Hooked counts the pod cgroups the packet hook (sl_pol_ingress)
	// is on (see policyTargets).
	Hooked int `json:"hooked_cgroups"`
	// Took is the time until the new tables were live; Cleared the time
	// spent after that emptying the previous bank.
	Took    time.Duration `json:"took_ns"`
	Cleared time.Duration `json:"cleared_ns"`
}

// PolicyCount is what the datapath decided under one policy id.
type PolicyCount struct {
	Allowed uint64 `json:"allowed"`
	Denied  uint64 `json:"denied"`
}

type (
	polIPKey     = servicelbSlPolIpKey
	polPeer      = servicelbSlPolPeer
	polCgroupKey = servicelbSlPolCgroupKey
	polRuleKey   = servicelbSlPolRuleKey
	polRule      = servicelbSlPolRule
	polLive      = servicelbSlPolLive
)

// PolicyLive is the live bank, whether policy is on, and the applies so far.
func (d *Datapath) PolicyLive() (bank uint32, enabled bool, generation uint64, err error) {
	var l polLive
	if err := d.lb.SlPolCtl.Lookup(uint32(0), &l); err != nil {
		return 0, false, 0, fmt.Errorf("reading the policy state: %w", err)
	}
	return l.Bank, l.Enabled != 0, l.Generation, nil
}

// policyGrace is how long a publish waits before it empties the previous
// bank: a program that read the bank number just before the publish
// finishes its lookups in microseconds.
const policyGrace = 20 * time.Millisecond

// ApplyPolicies writes compiled tables to the bank that is not live and
// publishes it with one update; the programs read the live bank once per
// decision, so none sees half an apply. The previous bank is emptied
// after a grace period, off the path to enforcement (an apply that finds
// it not emptied, its applier having died, empties it first). freed are
// ids of policies gone since the last apply: their counters restart from
// zero.
func (d *Datapath) ApplyPolicies(t *policy.Tables, freed []uint32) (PolicyStats, error) {
	start := time.Now()
	var cur polLive
	if err := d.lb.SlPolCtl.Lookup(uint32(0), &cur); err != nil {
		return PolicyStats{}, fmt.Errorf("reading the policy state: %w", err)
	}
	live, gen := cur.Bank, cur.Generation
	next := 1 - live
	if cur.Dirty != 0 {
		if err := d.clearPolicyBank(next); err != nil {
			return PolicyStats{}, err
		}
	}
	targets, err := policyTargets(t)
	if err != nil {
		return PolicyStats{}, fmt.Errorf("finding the cgroups of pods for the policy's packet hook: %w", err)
	}
	st := PolicyStats{Policies: len(t.IDs), Addresses: len(t.IPs), Cgroups: len(t.Cgroups), Rules: len(t.Rules), Bank: next, Hooked: len(targets)}
	ipKeys, ipVals := make([]polIPKey, len(t.IPs)), make([]polPeer, len(t.IPs))
	for i, e := range t.IPs {
		bits := e.Prefix.Bits()
		if e.Prefix.Addr().Is4() {
			bits += 96
		}
		ipKeys[i] = polIPKey{Prefixlen: 32 + uint32(bits), Bank: next, Ip: addrWords(e.Prefix.Masked().Addr())}
		ipVals[i] = peerOf(e.Entry)
	}
	if err := batchPut(d.lb.SlPolIps, ipKeys, ipVals); err != nil {
		return st, fmt.Errorf("writing policy addresses: %w", err)
	}
	cgKeys, cgVals := make([]polCgroupKey, len(t.Cgroups)), make([]polPeer, len(t.Cgroups))
	for i, e := range t.Cgroups {
		cgKeys[i] = polCgroupKey{Cgroup: e.ID, Bank: next}
		cgVals[i] = peerOf(e.Entry)
	}
	if err := batchPut(d.lb.SlPolCgroups, cgKeys, cgVals); err != nil {
		return st, fmt.Errorf("writing policy endpoints: %w", err)
	}
	rKeys, rVals := make([]polRuleKey, len(t.Rules)), make([]polRule, len(t.Rules))
	for i, r := range t.Rules {
		k := polRuleKey{Bank: next, Ep: r.Endpoint, Dir: dirOf(r.Dir), Class: r.Class, Prefixlen: uint32(servicelbSlPolRuleBitsSL_POL_RULE_ALL_BITS)}
		if r.Protocol != 0 {
			k.Proto = uint8(r.Protocol)
			k.Port = [2]uint8{uint8(r.Port >> 8), uint8(r.Port)}
			k.Prefixlen = uint32(servicelbSlPolRuleBitsSL_POL_RULE_PROTO_BITS) + uint32(r.Bits)
		}
		rKeys[i] = k
		rVals[i] = polRule{Policy: r.Policy}
	}
	if err := batchPut(d.lb.SlPolRules, rKeys, rVals); err != nil {
		return st, fmt.Errorf("writing policy rules: %w", err)
	}
	zero := make([]servicelbSlPolCount, len(freed))
	if err := batchPut(d.lb.SlPolStats, freed, zero); err != nil {
		return st, fmt.Errorf("resetting counters of removed policies: %w", err)
	}
	// The packet hook goes on the pods that need it before the bank
	// that isolates them (or their peers) is live (until then it finds
	// nobody newly isolated and lets every packet in), and comes off the
	// pods that no longer need it only after it.
	made, err := d.attachTargets(polLinkPrefix, policyHooks, targets, nil)
	if err != nil {
		return st, fmt.Errorf("attaching the policy's packet hook: %w", err)
	}
	l := polLive{Bank: next, Generation: gen + 1, Dirty: 1}
	if len(t.IDs) > 0 {
		l.Enabled = 1
	}
	if err := d.lb.SlPolCtl.Put(uint32(0), &l); err != nil {
		detachPins(made)
		return st, fmt.Errorf("publishing policy bank %d: %w", next, err)
	}
	st.Took = time.Since(start)
	if err := d.detachTargetsBut(polLinkPrefix, policyHooks, targets); err != nil {
		return st, fmt.Errorf("detaching the policy's packet hook from pods that no longer need it: %w", err)
	}
	if err := d.dropLegacyPolHooks(); err != nil {
		return st, fmt.Errorf("detaching the policy's packet hook from attachments: %w", err)
	}
	time.Sleep(policyGrace)
	cleared := time.Now()
	if err := d.clearPolicyBank(live); err != nil {
		return st, err
	}
	l.Dirty = 0
	if err := d.lb.SlPolCtl.Put(uint32(0), &l); err != nil {
		return st, fmt.Errorf("recording policy bank %d empty: %w", live, err)
	}
	st.Cleared = time.Since(cleared)
	return st, nil
}

// clearPolicyBank removes every entry of bank b.
func (d *Datapath) clearPolicyBank(b uint32) error {
	ips, err := readAll[polIPKey, polPeer](d.lb.SlPolIps)
	if err != nil {
		return fmt.Errorf("reading policy addresses: %w", err)
	}
	if err := deleteAll(d.lb.SlPolIps, keysWhere(ips, func(k polIPKey) bool { return k.Bank == b })); err != nil {
		return fmt.Errorf("clearing policy addresses: %w", err)
	}
	cgs, err := readAll[polCgroupKey, polPeer](d.lb.SlPolCgroups)
	if err != nil {
		return fmt.Errorf("reading policy endpoints: %w", err)
	}
	if err := deleteAll(d.lb.SlPolCgroups, keysWhere(cgs, func(k polCgroupKey) bool { return k.Bank == b })); err != nil {
		return fmt.Errorf("clearing policy endpoints: %w", err)
	}
	rules, err := readAll[polRuleKey, polRule](d.lb.SlPolRules)
	if err != nil {
		return fmt.Errorf("reading policy rules: %w", err)
	}
	if err := deleteAll(d.lb.SlPolRules, keysWhere(rules, func(k polRuleKey) bool { return k.Bank == b })); err != nil {
		return fmt.Errorf("clearing policy rules: %w", err)
	}
	return nil
}

func keysWhere[K comparable, V any](m map[K]V, keep func(K) bool) []K {
	var out []K
	for k := range m {
		if keep(k) {
			out = append(out, k)
		}
	}
	return out
}

func dirOf(d policy.Direction) uint32 {
	if d == policy.Egress {
		return uint32(servicelbSlPolDirSL_POL_EGRESS)
	}
	return uint32(servicelbSlPolDirSL_POL_INGRESS)
}

func peerOf(e policy.Entry) polPeer {
	p := polPeer{Class: e.Class, Class6: e.Class6, Identity: e.Identity, Ep: e.Endpoint}
	if e.Isolated[policy.Ingress] {
		p.Flags |= uint32(servicelbSlPolFlagSL_POL_ISOLATED_INGRESS)
		p.Policy[servicelbSlPolDirSL_POL_INGRESS] = e.Policy[policy.Ingress]
	}
	if e.Isolated[policy.Egress] {
		p.Flags |= uint32(servicelbSlPolFlagSL_POL_ISOLATED_EGRESS)
		p.Policy[servicelbSlPolDirSL_POL_EGRESS] = e.Policy[policy.Egress]
	}
	return p
}

// PolicyCounts reads the verdicts per policy id (ids with none are left out).
func (d *Datapath) PolicyCounts() (map[uint32]PolicyCount, error) {
	all, err := readAll[uint32, servicelbSlPolCount](d.lb.SlPolStats)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil, fmt.Errorf("reading policy counters: %w", err)
	}
	out := map[uint32]PolicyCount{}
	for id, c := range all {
		if c.Allowed != 0 || c.Denied != 0 {
			out[id] = PolicyCount{Allowed: c.Allowed, Denied: c.Denied}
		}
	}
	return out, nil
}
