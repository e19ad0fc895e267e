package policy

import (
	"fmt"
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"
)

// Record is an applied set as it is kept on disk (the policies as their
// NetworkPolicy objects), with the ids the datapath counts them by.
type Record struct {
	Namespaces []Namespace                   `json:"namespaces"`
	Pods       []*Pod                        `json:"pods"`
	Policies   []*networkingv1.NetworkPolicy `json:"policies"`
	Host       []netip.Addr                  `json:"host"`
	IDs        map[string]uint32             `json:"ids"`
}

// Record keeps the set with its ids.
func (s *Set) Record(ids map[string]uint32) *Record {
	r := &Record{Namespaces: s.Namespaces, Pods: s.Pods, Host: s.Host, IDs: ids}
	for _, p := range s.Policies {
		src := p.Source
		if src == nil {
			src = &networkingv1.NetworkPolicy{}
			src.Namespace, src.Name = p.Namespace, p.Name
		}
		r.Policies = append(r.Policies, src)
	}
	return r
}

// Set rebuilds the set a record keeps.
func (r *Record) Set() (*Set, error) {
	s := &Set{Namespaces: r.Namespaces, Pods: r.Pods, Host: r.Host}
	for _, np := range r.Policies {
		p, errs := FromK8s(np)
		if len(errs) > 0 {
			return nil, fmt.Errorf("recorded policy %s/%s: %w", np.Namespace, np.Name, errs)
		}
		s.Policies = append(s.Policies, p)
	}
	s.sort()
	return s, nil
}
