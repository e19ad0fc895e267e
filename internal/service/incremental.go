package service

import (
	"cmp"
	"slices"
)

// Outcome is one service's place after a change: served (Service), left
// out (Skipped), or gone (neither).
type Outcome struct {
	Key     string
	Service *Service
	Skipped *Skipped
}

// Partitioner gives Partition's answer for services that change a few at
// a time, at the cost of the change: a service is checked when it
// changes, and only the services that share a frontend with a changed one
// (directly or through others) are judged again. While the accepted
// services fit the budget nobody is left out for room, and a change that
// keeps them fitting costs nothing more; once they do not, the rule
// "services before it" makes every service's fate depend on all those
// before it, and each change judges them all (the tables are full: a
// state to leave, not to run in).
type Partitioner struct {
	budget Budget
	// valid services by key, their frontends, and who claims each
	// frontend (keys, sorted).
	valid  map[string]*Service
	fronts map[string][]Frontend
	claims map[Frontend][]string
	// left out before any judgement: invalid, or ignored by the caller.
	invalid map[string]Skipped
	// the current outcome of every key, and the valid services that
	// win their frontends against the services before them, with what
	// they cost then.
	out  map[string]Outcome
	wins map[string][3]int
	// what the winners take of the budget.
	usedF, usedS, usedT int
	over                bool
	// keys changed, and frontends released, since the last Flush.
	dirty    map[string]bool
	released []Frontend
	// outcomes changed since the last Flush.
	changed map[string]bool
}

// NewPartitioner starts with no service. A zero budget is unbounded.
func NewPartitioner(budget Budget) *Partitioner {
	return &Partitioner{
		budget: budget, valid: map[string]*Service{}, fronts: map[string][]Frontend{},
		claims: map[Frontend][]string{}, invalid: map[string]Skipped{}, out: map[string]Outcome{},
		wins: map[string][3]int{}, dirty: map[string]bool{}, changed: map[string]bool{},
	}
}

// Put adds or redefines a service (checked here by the same rules as a
// file).
func (p *Partitioner) Put(s *Service) {
	if _, err := normalise([]*Service{s}, func(string) int { return 0 }); err != nil {
		p.drop(s.Key())
		p.invalid[s.Key()] = Skipped{Service: s.Key(), Reason: reasonOf(err)}
		return
	}
	key := s.Key()
	p.drop(key)
	p.valid[key] = s
	fs := s.Frontends()
	p.fronts[key] = fs
	for _, f := range fs {
		c := p.claims[f]
		i, _ := slices.BinarySearch(c, key)
		p.claims[f] = slices.Insert(c, i, key)
	}
}

// Ignore leaves a service out by the caller's judgement (sk.Service is
// its key).
func (p *Partitioner) Ignore(sk Skipped) {
	p.drop(sk.Service)
	p.invalid[sk.Service] = sk
}

// Delete forgets a service.
func (p *Partitioner) Delete(key string) { p.drop(key) }

// drop takes key out of the tables, marking it and the frontends it
// claimed for judgement.
func (p *Partitioner) drop(key string) {
	p.dirty[key] = true
	delete(p.invalid, key)
	if _, ok := p.valid[key]; !ok {
		return
	}
	for _, f := range p.fronts[key] {
		c := p.claims[f]
		if i, ok := slices.BinarySearch(c, key); ok {
			c = slices.Delete(c, i, i+1)
		}
		if len(c) == 0 {
			delete(p.claims, f)
		} else {
			p.claims[f] = c
		}
		p.released = append(p.released, f)
	}
	delete(p.valid, key)
	delete(p.fronts, key)
}

// Flush judges what changed and returns the outcomes that differ from
// those the last Flush returned (by key order).
func (p *Partitioner) Flush() []Outcome {
	// The services to judge again: the changed ones and every valid
	// service sharing a frontend with them, transitively.
	comp := map[string]bool{}
	var queue []string
	visit := func(k string) {
		if !comp[k] {
			comp[k] = true
			queue = append(queue, k)
		}
	}
	for k := range p.dirty {
		visit(k)
	}
	for _, f := range p.released {
		for _, k := range p.claims[f] {
			visit(k)
		}
	}
	for len(queue) > 0 {
		k := queue[0]
		queue = queue[1:]
		for _, f := range p.fronts[k] {
			for _, o := range p.claims[f] {
				visit(o)
			}
		}
	}
	keys := make([]string, 0, len(comp))
	for k := range comp {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	// Against the earlier services of its group, as Partition judges.
	held := map[Frontend]string{}
	for _, k := range keys {
		if c, ok := p.wins[k]; ok {
			p.usedF, p.usedS, p.usedT = p.usedF-c[0], p.usedS-c[1], p.usedT-c[2]
		}
		delete(p.wins, k)
		s, ok := p.valid[k]
		if !ok {
			continue
		}
		win := true
		for _, f := range p.fronts[k] {
			if _, taken := held[f]; taken {
				win = false
				break
			}
		}
		if !win {
			continue
		}
		nf, ns, nt := s.cost()
		p.wins[k] = [3]int{nf, ns, nt}
		p.usedF, p.usedS, p.usedT = p.usedF+nf, p.usedS+ns, p.usedT+nt
		for _, f := range p.fronts[k] {
			held[f] = k
		}
	}
	over := p.exceeds(p.usedF, p.usedS, p.usedT)
	if over || p.over {
		// Room decides, in key order: judge everybody.
		keys = keys[:0]
		for k := range p.valid {
			keys = append(keys, k)
		}
		for k := range p.invalid {
			keys = append(keys, k)
		}
		for k := range p.out {
			if !comp[k] {
				keys = append(keys, k)
			}
		}
		for k := range comp {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		keys = slices.Compact(keys)
		p.judge(keys, true)
	} else {
		p.judge(keys, false)
	}
	p.over = over
	clear(p.dirty)
	p.released = p.released[:0]
	res := make([]Outcome, 0, len(p.changed))
	for k := range p.changed {
		o, ok := p.out[k]
		if !ok {
			o = Outcome{Key: k}
		}
		res = append(res, o)
	}
	clear(p.changed)
	slices.SortFunc(res, func(a, b Outcome) int { return cmp.Compare(a.Key, b.Key) })
	return res
}

// judge sets the outcome of keys (sorted): Partition's rules, with room
// checked only when room is short.
func (p *Partitioner) judge(keys []string, room bool) {
	held := map[Frontend]string{}
	usedF, usedS, usedT := 0, 0, 0
	for _, k := range keys {
		var o Outcome
		o.Key = k
		s, valid := p.valid[k]
		switch {
		case !valid:
			if sk, ok := p.invalid[k]; ok {
				o.Skipped = &sk
			}
		case room:
			var clash string
			for _, f := range p.fronts[k] {
				if prev, ok := held[f]; ok {
					clash = f.String() + " is already served by " + prev
					break
				}
			}
			nf, ns, nt := s.cost()
			switch {
			case clash != "":
				o.Skipped = &Skipped{Service: k, Reason: clash}
			case p.budget.Frontends > 0 && usedF+nf > p.budget.Frontends || p.budget.BackendSlots > 0 && usedS+ns > p.budget.BackendSlots:
				o.Skipped = &Skipped{Service: k, Reason: roomReason(nf, ns, usedF, usedS, p.budget)}
			case p.budget.MaglevTables > 0 && usedT+nt > p.budget.MaglevTables:
				o.Skipped = &Skipped{Service: k, Reason: maglevReason(nt, usedT, p.budget)}
			default:
				o.Service = s
				usedF, usedS, usedT = usedF+nf, usedS+ns, usedT+nt
				for _, f := range p.fronts[k] {
					held[f] = k
				}
			}
		default:
			if _, ok := p.wins[k]; ok {
				o.Service = s
				break
			}
			// The first of its frontends a service before it holds.
		clash:
			for _, f := range p.fronts[k] {
				for _, c := range p.claims[f] {
					if _, won := p.wins[c]; won && c < k {
						o.Skipped = &Skipped{Service: k, Reason: f.String() + " is already served by " + c}
						break clash
					}
				}
			}
		}
		p.set(o)
	}
}

// set records o, noting whether it differs from the key's outcome.
func (p *Partitioner) set(o Outcome) {
	prev, had := p.out[o.Key]
	if o.Service == nil && o.Skipped == nil {
		if had {
			delete(p.out, o.Key)
			p.changed[o.Key] = true
		}
		return
	}
	p.out[o.Key] = o
	if !had || p.dirty[o.Key] || prev.Service != o.Service || (prev.Skipped == nil) != (o.Skipped == nil) ||
		prev.Skipped != nil && *prev.Skipped != *o.Skipped {
		p.changed[o.Key] = true
	}
}

func (p *Partitioner) exceeds(f, s, t int) bool {
	b := p.budget
	return b.Frontends > 0 && f > b.Frontends || b.BackendSlots > 0 && s > b.BackendSlots || b.MaglevTables > 0 && t > b.MaglevTables
}

// Snapshot is the whole answer: the set served and the services left out,
// as Partition returns them.
func (p *Partitioner) Snapshot() (*Set, []Skipped) {
	set := &Set{}
	var skipped []Skipped
	for _, o := range p.out {
		if o.Service != nil {
			set.Services = append(set.Services, o.Service)
		} else {
			skipped = append(skipped, *o.Skipped)
		}
	}
	slices.SortFunc(set.Services, func(a, b *Service) int { return cmp.Compare(a.Key(), b.Key()) })
	slices.SortFunc(skipped, func(a, b Skipped) int { return cmp.Compare(a.Service, b.Service) })
	return set, skipped
}
