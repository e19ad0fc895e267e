package top

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/service"
)

func conn(slot uint32, client string, up, down uint64) datapath.Conn {
	return datapath.Conn{
		Slot: slot, State: "bypass",
		Client: netip.MustParseAddrPort(client), Server: netip.MustParseAddrPort("198.18.1.3:7000"),
		ClientToServer: datapath.Direction{Path: "bypass", Bytes: up},
		ServerToClient: datapath.Direction{Path: "bypass", Bytes: down},
	}
}

// counts builds counters by name; a name the C enum lacks fails the test.
func counts(t *testing.T, byName map[string]uint64) datapath.Counts[datapath.Counter] {
	t.Helper()
	c, err := datapath.CountsOf[datapath.Counter](byName)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCompute(t *testing.T) {
	fe := service.Frontend{VIP: netip.MustParseAddr("198.19.0.10"), Port: 80, Protocol: service.TCP}
	be := netip.MustParseAddrPort("198.18.1.3:7000")
	t0 := time.Unix(1000, 0)
	prev := Sample{At: t0,
		Conns:    []datapath.Conn{conn(1, "198.18.1.2:40000", 1000, 1000), conn(2, "198.18.1.4:40001", 0, 0)},
		Counters: counts(t, map[string]uint64{"redirect_bytes": 2000, "conns_bypassed": 2}),
		Services: &datapath.LBStats{Selections: []datapath.Selection{{Frontend: fe, Backend: be, Count: 10}}, Refused: map[string]uint64{fe.String(): 1}},
	}
	cur := Sample{At: t0.Add(2 * time.Second), Sockets: 6,
		Conns: []datapath.Conn{
			conn(1, "198.18.1.2:40000", 3000, 1000), // 1000 B/s up
			conn(2, "198.18.1.4:40001", 8000, 8000), // 8000 B/s
			conn(3, "198.18.1.5:40002", 100, 100),   // new: 100 B/s
			conn(4, "198.18.1.6:40003", 0, 0),       // idle
		},
		Counters: counts(t, map[string]uint64{"redirect_bytes": 22200, "conns_bypassed": 4}),
		Services: &datapath.LBStats{Selections: []datapath.Selection{{Frontend: fe, Backend: be, Count: 30}}, Refused: map[string]uint64{fe.String(): 5}},
		Names:    map[string]string{fe.String(): "default/web"},
	}
	f := Compute(prev, cur, 3)
	if len(f.Conns) != 3 {
		t.Fatalf("%d connections, want the 3 busiest", len(f.Conns))
	}
	var order []uint16
	for _, c := range f.Conns {
		order = append(order, c.Client.Port())
	}
	if order[0] != 40001 || order[1] != 40000 || order[2] != 40002 {
		t.Errorf("busiest first: %v", order)
	}
	if f.Conns[1].Up != 1000 || f.Conns[1].Down != 0 || f.Conns[0].Up != 4000 {
		t.Errorf("rates %+v", f.Conns)
	}
	if f.BypassBytes != 10100 || f.Bypassed != 1 {
		t.Errorf("totals: %v B/s, %v conns/s", f.BypassBytes, f.Bypassed)
	}
	if len(f.Services) != 1 || f.Services[0].Service != "default/web" || f.Services[0].Selected != 10 || f.Services[0].Refused != 2 {
		t.Errorf("services %+v", f.Services)
	}
	out := Render(f)
	for _, want := range []string{"198.18.1.4:40001", "4.0 KB/s", "default/web", "bypassed sockets 6"} {
		if !strings.Contains(out, want) {
			t.Errorf("rendering lacks %q:\n%s", want, out)
		}
	}
	// A reused slot (counts went down) is not a negative rate.
	f = Compute(cur, Sample{At: cur.At.Add(time.Second), Conns: []datapath.Conn{conn(2, "198.18.1.4:40001", 10, 10)}}, 0)
	if f.Conns[0].Up != 0 || f.BypassBytes != 0 {
		t.Errorf("reset counters gave rates %+v, %v", f.Conns[0], f.BypassBytes)
	}
}
