package conntable

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/datapath"
)

func conn(client, server string, state string, netns, serverNetns uint64, bytes uint64, age time.Duration) datapath.Conn {
	return datapath.Conn{
		Client: netip.MustParseAddrPort(client), Server: netip.MustParseAddrPort(server), State: state,
		NetNS: netns, ServerNetNS: serverNetns, Age: age,
		ClientToServer: datapath.Direction{Bytes: bytes},
	}
}

var table = []datapath.Conn{
	conn("198.18.1.2:40000", "198.18.1.3:7000", "bypass", 1, 2, 100, time.Second),
	conn("198.18.1.4:40001", "198.18.1.3:7000", "bypass", 3, 2, 900, 3*time.Second),
	conn("198.18.1.4:40002", "198.18.1.5:8080", "tcp", 3, 4, 50, 2*time.Second),
}

func TestFilter(t *testing.T) {
	cases := []struct {
		name string
		f    Filter
		want []uint16 // client ports kept
	}{
		{"bypassed only", Filter{}, []uint16{40000, 40001}},
		{"all", Filter{All: true}, []uint16{40000, 40001, 40002}},
		{"client pod", Filter{Netns: map[uint64]bool{1: true}}, []uint16{40000}},
		{"server pod", Filter{Netns: map[uint64]bool{2: true}}, []uint16{40000, 40001}},
		{"port", Filter{All: true, Port: 8080}, []uint16{40002}},
		{"client port", Filter{Port: 40001}, []uint16{40001}},
		{"address", Filter{All: true, Addr: netip.MustParseAddr("198.18.1.4")}, []uint16{40001, 40002}},
		{"nothing", Filter{Port: 9999}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.f.Apply(slices.Clone(table))
			var ports []uint16
			for _, c := range got {
				ports = append(ports, c.Client.Port())
			}
			if !slices.Equal(ports, tc.want) {
				t.Errorf("kept %v, want %v", ports, tc.want)
			}
		})
	}
}

func TestSort(t *testing.T) {
	cases := []struct {
		key  string
		want []uint16
	}{
		{"age", []uint16{40001, 40002, 40000}},
		{"bytes", []uint16{40001, 40000, 40002}},
		{"client", []uint16{40000, 40001, 40002}},
		{"server", []uint16{40000, 40001, 40002}},
	}
	for _, tc := range cases {
		t.Run(tc.key, func(t *testing.T) {
			c := slices.Clone(table)
			if err := Sort(c, tc.key); err != nil {
				t.Fatal(err)
			}
			var ports []uint16
			for _, x := range c {
				ports = append(ports, x.Client.Port())
			}
			if !slices.Equal(ports, tc.want) {
				t.Errorf("order %v, want %v", ports, tc.want)
			}
		})
	}
	if err := Sort(slices.Clone(table), "speed"); err == nil {
		t.Error("unknown sort key accepted")
	}
}
