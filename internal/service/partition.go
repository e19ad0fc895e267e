package service

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Skipped is a service left out of a set, and why.
type Skipped struct {
	Service string `json:"service"` // namespace/name
	Reason  string `json:"reason"`
	// Ignored: not served by design (another proxy's, headless,
	// ExternalName), not for a fault.
	Ignored bool `json:"ignored,omitempty"`
}

// Budget is what the node's tables hold: frontends, and backend slots
// (each frontend's backends, twice: a frontend's new backends are written
// beside the old ones before they take over).
type Budget struct {
	Frontends, BackendSlots int
	// MaglevTables: each frontend of a Maglev service takes two.
	MaglevTables int
}

// cost is what s takes of a Budget.
func (s *Service) cost() (frontends, slots, tables int) {
	frontends, slots = s.slotCost()
	if s.Selection == SelectMaglev {
		tables = 2 * frontends
	}
	return frontends, slots, tables
}

func (s *Service) slotCost() (frontends, slots int) {
	for _, f := range s.Frontends() {
		n := 0
		for _, b := range s.Backends {
			if b.IP.Is4() == f.VIP.Is4() {
				n++
			}
		}
		frontends++
		slots += 2 * n
	}
	return frontends, slots
}

// Partition checks each service on its own, as a cluster's services come
// and go independently: a service that breaks a rule, claims a name or
// frontend an earlier service (in namespace/name order) holds, or does
// not fit in what budget leaves, is skipped with its reason, and the rest
// form the set. A zero budget is unbounded.
func Partition(svcs []*Service, budget Budget) (*Set, []Skipped) {
	var cands []*Service
	var skipped []Skipped
	for _, s := range svcs {
		if s == nil {
			continue
		}
		if _, err := normalise([]*Service{s}, func(string) int { return 0 }); err != nil {
			skipped = append(skipped, Skipped{Service: s.Key(), Reason: reasonOf(err)})
			continue
		}
		cands = append(cands, s)
	}
	slices.SortStableFunc(cands, func(a, b *Service) int { return cmp.Compare(a.Key(), b.Key()) })
	set := &Set{}
	names := map[string]bool{}
	fronts := map[Frontend]string{}
	usedFronts, usedSlots, usedTables := 0, 0, 0
	for _, s := range cands {
		if names[s.Key()] {
			skipped = append(skipped, Skipped{Service: s.Key(), Reason: "defined twice"})
			continue
		}
		var clash string
		for _, f := range s.Frontends() {
			if prev, ok := fronts[f]; ok {
				clash = fmt.Sprintf("%s is already served by %s", f, prev)
				break
			}
		}
		if clash != "" {
			skipped = append(skipped, Skipped{Service: s.Key(), Reason: clash})
			continue
		}
		nf, ns, nt := s.cost()
		if budget.Frontends > 0 && usedFronts+nf > budget.Frontends || budget.BackendSlots > 0 && usedSlots+ns > budget.BackendSlots {
			skipped = append(skipped, Skipped{Service: s.Key(), Reason: roomReason(nf, ns, usedFronts, usedSlots, budget)})
			continue
		}
		if budget.MaglevTables > 0 && usedTables+nt > budget.MaglevTables {
			skipped = append(skipped, Skipped{Service: s.Key(), Reason: maglevReason(nt, usedTables, budget)})
			continue
		}
		usedFronts += nf
		usedSlots += ns
		usedTables += nt
		names[s.Key()] = true
		for _, f := range s.Frontends() {
			fronts[f] = s.Key()
		}
		set.Services = append(set.Services, s)
	}
	slices.SortFunc(skipped, func(a, b Skipped) int { return cmp.Compare(a.Service, b.Service) })
	return set, skipped
}

func roomReason(nf, ns, usedF, usedS int, budget Budget) string {
	return fmt.Sprintf("the node's service tables are full: it needs %d frontends and %d backend slots; %d of %d and %d of %d are taken by the services before it",
		nf, ns, usedF, budget.Frontends, usedS, budget.BackendSlots)
}

func maglevReason(nt, usedT int, budget Budget) string {
	return fmt.Sprintf("the node's Maglev tables are full: it needs %d; %d of %d are taken by the services before it (use selection: Random)",
		nt, usedT, budget.MaglevTables)
}

// reasonOf writes one service's validation errors without the position
// prefix ("services[0]."), which means nothing outside a file.
func reasonOf(err error) string {
	var es Errors
	if !errors.As(err, &es) {
		return err.Error()
	}
	var parts []string
	for _, e := range es {
		field := strings.TrimPrefix(strings.TrimPrefix(e.Field, "services[0]"), ".")
		if field == "" {
			parts = append(parts, e.Msg)
		} else {
			parts = append(parts, field+": "+e.Msg)
		}
	}
	return strings.Join(parts, "; ")
}
