package ports

import (
	"net/netip"
	"strings"
	"testing"
)

const good = `workloads:
  - name: a
    cgroup: /sys/fs/cgroup/a
    ports:
      - {port: 3000}
      - {port: 7000-7002, protocol: udp}
      - {port: 0}
    pool: 21000-21009
    reuseAfterSeconds: 0
    addresses: [198.19.9.1, "2001:db8:9::1"]
  - name: b
    pod: default/web
    container: app
    ports: [{port: 3000}]
    pool: 21000-21019
routes:
  - {port: 3000, to: b}
  - {port: 7001, protocol: UDP, to: a}
`

func TestParse(t *testing.T) {
	set, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	a := set.Workload("a")
	if a == nil || a.Ports[1].Protocol != "UDP" || a.Ports[1].Port != (Range{7000, 7002}) || a.ReuseAfterSeconds() != 0 {
		t.Fatalf("workload a: %+v", a)
	}
	if b := set.Workload("b"); b.ReuseAfterSeconds() != DefaultReuseAfter || b.Ports[0].Protocol != "TCP" {
		t.Errorf("workload b defaults: %+v", b)
	}
	if set.Routes[0].Protocol != "TCP" {
		t.Errorf("route protocol default: %+v", set.Routes[0])
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"not yaml", "workloads: [", "parsing YAML"},
		{"unknown field", "workloads:\n  - name: a\n    cgroups: /x\n", "field cgroups not found"},
		{"two documents", "workloads: []\n---\nworkloads: []\n", "more than one YAML document"},
		{"bad name", "workloads:\n  - {name: A, cgroup: /x, ports: [{port: 1}], pool: 2000-2001}\n", "line 2: workloads[0].name"},
		{"twice", "workloads:\n  - {name: a, cgroup: /x, ports: [{port: 1}], pool: 2000-2001}\n  - {name: a, cgroup: /y, ports: [{port: 1}], pool: 2000-2001}\n", "defined twice"},
		{"two selectors", "workloads:\n  - {name: a, cgroup: /x, pid: 3, ports: [{port: 1}], pool: 2000-2001}\n", "exactly one of"},
		{"relative cgroup", "workloads:\n  - {name: a, cgroup: x, ports: [{port: 1}], pool: 2000-2001}\n", "not an absolute path"},
		{"bad pod", "workloads:\n  - {name: a, pod: web, ports: [{port: 1}], pool: 2000-2001}\n", "NAMESPACE/NAME"},
		{"container alone", "workloads:\n  - {name: a, cgroup: /x, container: c, ports: [{port: 1}], pool: 2000-2001}\n", "needs pod"},
		{"bad selector", "workloads:\n  - {name: a, selector: app, ports: [{port: 1}], pool: 2000-2001}\n", "key=value"},
		{"no ports", "workloads:\n  - {name: a, cgroup: /x, pool: 2000-2001}\n", "no virtual ports"},
		{"bad port", "workloads:\n  - {name: a, cgroup: /x, ports: [{port: 70000}], pool: 2000-2001}\n", "0..65535"},
		{"reversed range", "workloads:\n  - {name: a, cgroup: /x, ports: [{port: 9-3}], pool: 2000-2001}\n", "first no larger"},
		{"zero in range", "workloads:\n  - {name: a, cgroup: /x, ports: [{port: 0-3}], pool: 2000-2001}\n", "port 0 stands alone"},
		{"overlap", "workloads:\n  - {name: a, cgroup: /x, ports: [{port: 5-9}, {port: 9}], pool: 2000-2001}\n", "overlaps ports[0]"},
		{"protocol", "workloads:\n  - {name: a, cgroup: /x, ports: [{port: 5, protocol: sctp}], pool: 2000-2001}\n", "want TCP or UDP"},
		{"no pool", "workloads:\n  - {name: a, cgroup: /x, ports: [{port: 5}]}\n", "give a pool"},
		{"low pool", "workloads:\n  - {name: a, cgroup: /x, ports: [{port: 5}], pool: 80-90}\n", "within 1024..65535"},
		{"pool over virtual", "workloads:\n  - {name: a, cgroup: /x, ports: [{port: 5000}], pool: 2000-2001}\n  - {name: b, cgroup: /y, ports: [{port: 1}], pool: 4990-5010}\n", "a pool holds real ports only"},
		{"reuse", "workloads:\n  - {name: a, cgroup: /x, ports: [{port: 5}], pool: 2000-2001, reuseAfterSeconds: -1}\n", "want 0..3600"},
		{"loopback address", "workloads:\n  - {name: a, cgroup: /x, ports: [{port: 5}], pool: 2000-2001, addresses: [127.0.0.2]}\n", "not loopback"},
		{"not an address", "workloads:\n  - {name: a, cgroup: /x, ports: [{port: 5}], pool: 2000-2001, addresses: [198.19.300.1]}\n", "198.19.300.1"},
		{"address twice", "workloads:\n  - {name: a, cgroup: /x, ports: [{port: 5}], pool: 2000-2001, addresses: [198.19.0.1]}\n  - {name: b, cgroup: /y, ports: [{port: 5}], pool: 2000-2001, addresses: [\"::ffff:198.19.0.1\"]}\n", "is a's already"},
		{"route target", "workloads: []\nroutes:\n  - {port: 5, to: z}\n", "not a workload of this file"},
		{"route port", "workloads:\n  - {name: a, cgroup: /x, ports: [{port: 5}], pool: 2000-2001}\nroutes:\n  - {port: 6, to: a}\n", "has no virtual port 6/TCP"},
		{"route twice", "workloads:\n  - {name: a, cgroup: /x, ports: [{port: 5}], pool: 2000-2001}\nroutes:\n  - {port: 5, to: a}\n  - {port: 5, to: a}\n", "a second route"},
		{"route proto", "workloads:\n  - {name: a, cgroup: /x, ports: [{port: 5}], pool: 2000-2001}\nroutes:\n  - {port: 5, protocol: UDP, to: a}\n", "has no virtual port 5/UDP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, err := Parse([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse: %v (set %v); want an error with %q", err, set, tc.want)
			}
		})
	}
}

func TestCompile(t *testing.T) {
	set, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	ids := AssignIDs(set, map[string]uint32{"b": 7, "gone": 1})
	if ids["b"] != 7 || ids["a"] != 2 {
		t.Fatalf("ids %v: want b kept at 7, a the lowest free (2: 1 is a retired workload's)", ids)
	}
	tb := Compile(set, ids, map[string][]Cgroup{"a": {{10, 3}, {11, 5}}, "b": {{12, 4}}}, []netip.Addr{netip.MustParseAddr("198.18.0.1")})
	if tb.MinLevel != 3 || tb.MaxLevel != 5 {
		t.Errorf("levels %d..%d, want 3..5", tb.MinLevel, tb.MaxLevel)
	}
	if tb.WorkloadAddrs[netip.MustParseAddr("198.19.9.1")] != 2 || tb.WorkloadAddrs[netip.MustParseAddr("2001:db8:9::1")] != 2 || len(tb.WorkloadAddrs) != 2 {
		t.Errorf("workload addresses %v", tb.WorkloadAddrs)
	}
	if tb.Cgroups[10] != 2 || tb.Cgroups[11] != 2 || tb.Cgroups[12] != 7 {
		t.Errorf("cgroups %v", tb.Cgroups)
	}
	if len(tb.VPorts) != 1+3+1+1 {
		t.Errorf("%d virtual port rules, want 6 (ranges expanded): %v", len(tb.VPorts), tb.VPorts)
	}
	if r := tb.VPorts[VKey{2, 0, ProtoTCP}]; !r.Ephemeral || r.PoolLo != 21000 || r.PoolHi != 21009 || r.ReuseMillis != 0 {
		t.Errorf("a's port 0 rule: %+v", r)
	}
	if r := tb.VPorts[VKey{7, 3000, ProtoTCP}]; r.ReuseMillis != DefaultReuseAfter*1000 || r.PoolHi != 21019 {
		t.Errorf("b's 3000 rule: %+v", r)
	}
	if tb.Index[PKey{3000, ProtoTCP}] != 7 || tb.Index[PKey{7001, ProtoUDP}] != 2 {
		t.Errorf("routes in the index: %v", tb.Index)
	}
	if route, ok := tb.Index[PKey{7000, ProtoUDP}]; !ok || route != 0 {
		t.Errorf("7000/UDP: in index %v, route %d; want present without a route", ok, route)
	}
	if _, ok := tb.Index[PKey{0, ProtoTCP}]; ok {
		t.Errorf("port 0 is in the index: connects to port 0 are not virtual")
	}
	for p := 21000; p <= 21019; p++ {
		if tb.Pool[p/64]&(1<<(p%64)) == 0 {
			t.Errorf("pool bit of %d unset", p)
		}
	}
	if tb.Pool[20999/64]&(1<<(20999%64)) != 0 || tb.Pool[21020/64]&(1<<(21020%64)) != 0 {
		t.Errorf("pool bits set outside the pools")
	}
}

// FuzzParse: no input panics; an accepted one is consistent (every route
// reaches a workload having its port, no pool holds a virtual port).
func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte("workloads:\n  - {name: a, cgroup: /x, ports: [{port: 0}], pool: 2000-2001}\n"))
	f.Add([]byte("routes: [{port: 1, to: a}]"))
	f.Fuzz(func(t *testing.T, src []byte) {
		set, err := Parse(src)
		if err != nil {
			return
		}
		for _, r := range set.Routes {
			w := set.Workload(r.To)
			if w == nil || !w.Has(r.Port, r.Protocol) {
				t.Fatalf("route %+v accepted without its workload port", r)
			}
		}
		for _, w := range set.Workloads {
			if w.Pool.Lo < 1024 || w.Pool.Hi > 65535 || w.Pool.Lo > w.Pool.Hi {
				t.Fatalf("pool %v accepted", w.Pool)
			}
			for _, v := range set.Workloads {
				for _, p := range v.Ports {
					if p.Port.Lo > 0 && p.Port.overlaps(w.Pool) {
						t.Fatalf("pool %v holds virtual port %v", w.Pool, p.Port)
					}
				}
			}
		}
	})
}
