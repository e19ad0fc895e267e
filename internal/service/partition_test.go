package service

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func svcWith(name, vip string, port uint16, backends int) *Service {
	s := &Service{Name: name, VIPs: []netip.Addr{netip.MustParseAddr(vip)}, Ports: []Port{{Port: port}}}
	for i := range backends {
		s.Backends = append(s.Backends, Backend{IP: netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})})
	}
	return s
}

// TestPartition: one service that cannot be served never holds back the
// others.
func TestPartition(t *testing.T) {
	tests := []struct {
		name    string
		svcs    []*Service
		budget  Budget
		kept    []string
		skipped map[string]string // service -> part of the reason
	}{
		{"all good", []*Service{svcWith("a", "198.19.0.1", 80, 2), svcWith("b", "198.19.0.2", 80, 5000)}, Budget{}, []string{"default/a", "default/b"}, nil},
		{"too many backends", []*Service{svcWith("big", "198.19.0.1", 80, MaxBackends+1), svcWith("b", "198.19.0.2", 80, 3)}, Budget{},
			[]string{"default/b"}, map[string]string{"default/big": fmt.Sprintf("at most %d", MaxBackends)}},
		{"bad port", []*Service{svcWith("zero", "198.19.0.1", 0, 1), svcWith("b", "198.19.0.2", 80, 1)}, Budget{},
			[]string{"default/b"}, map[string]string{"default/zero": "ports[0].port: want a port"}},
		{"same frontend: first by name keeps it", []*Service{svcWith("z", "198.19.0.1", 80, 1), svcWith("a", "198.19.0.1", 80, 1)}, Budget{},
			[]string{"default/a"}, map[string]string{"default/z": "already served by default/a"}},
		{"over the node's tables", []*Service{svcWith("a", "198.19.0.1", 80, 10), svcWith("b", "198.19.0.2", 80, 10), svcWith("c", "198.19.0.3", 80, 1)},
			Budget{Frontends: 100, BackendSlots: 25}, []string{"default/a", "default/c"}, map[string]string{"default/b": "tables are full"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, skipped := Partition(tt.svcs, tt.budget)
			var kept []string
			for _, s := range set.Services {
				kept = append(kept, s.Key())
			}
			if strings.Join(kept, " ") != strings.Join(tt.kept, " ") {
				t.Errorf("kept %v, want %v", kept, tt.kept)
			}
			if len(skipped) != len(tt.skipped) {
				t.Errorf("skipped %v, want %v", skipped, tt.skipped)
			}
			for _, sk := range skipped {
				if want, ok := tt.skipped[sk.Service]; !ok || !strings.Contains(sk.Reason, want) {
					t.Errorf("skipped %s: %q, want a reason with %q", sk.Service, sk.Reason, want)
				}
			}
		})
	}
}
