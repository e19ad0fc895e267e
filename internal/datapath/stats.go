package datapath

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Direction is one direction of a connection.
type Direction struct {
	Path     string `json:"path"`
	Msgs     uint64 `json:"msgs"`
	Bytes    uint64 `json:"bytes"`
	TCPMsgs  uint64 `json:"tcp_msgs"`
	TCPBytes uint64 `json:"tcp_bytes"`
	Fallback string `json:"fallback,omitempty"`
}

// Conn is one row of the connection table.
type Conn struct {
	Slot   uint32         `json:"slot"`
	State  string         `json:"state"`
	Client netip.AddrPort `json:"client"`
	Server netip.AddrPort `json:"server"`
	NetNS  uint64         `json:"netns_cookie,omitempty"` // the client's
	// ServerNetNS is the server socket's network namespace cookie.
	ServerNetNS uint64        `json:"server_netns_cookie,omitempty"`
	Age         time.Duration `json:"age_ns"`
	Members     []string      `json:"members"`
	// ClientToServer and ServerToClient are the two directions.
	ClientToServer Direction `json:"client_to_server"`
	ServerToClient Direction `json:"server_to_client"`
}

var stateNames = map[uint32]string{
	uint32(bypassSlConnStateSL_CONN_FREE):    "free",
	uint32(bypassSlConnStateSL_CONN_PENDING): "pending",
	uint32(bypassSlConnStateSL_CONN_BYPASS):  "bypass",
	uint32(bypassSlConnStateSL_CONN_TCP):     "tcp",
}

var pathNames = map[uint8]string{
	uint8(bypassSlPathSL_PATH_UNDECIDED): "undecided",
	uint8(bypassSlPathSL_PATH_BYPASS):    "bypass",
	uint8(bypassSlPathSL_PATH_TCP):       "tcp",
}

func addrOf(w [4]uint32) netip.Addr {
	var b [16]byte
	for i, v := range w {
		// Words hold network-order bytes as loaded on a little-endian CPU.
		b[4*i] = byte(v)
		b[4*i+1] = byte(v >> 8)
		b[4*i+2] = byte(v >> 16)
		b[4*i+3] = byte(v >> 24)
	}
	return netip.AddrFrom16(b).Unmap()
}

// Conns reads the connection table: every connection with both ends, or one
// end waiting, managed by this datapath.
func (d *Datapath) Conns() ([]Conn, error) {
	names := d.counterNames
	var now unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &now); err != nil {
		return nil, fmt.Errorf("reading the monotonic clock: %w", err)
	}
	nowNs := uint64(now.Nano())
	var out []Conn
	err := d.eachConn(func(slot uint32, c *bypassSlConn) {
		state := wordState(c.Word)
		members := wordMembers(c.Word)
		row := Conn{
			Slot:        slot,
			State:       stateNames[state],
			Client:      netip.AddrPortFrom(addrOf(c.Client.LocalIp), c.Client.LocalPort),
			Server:      netip.AddrPortFrom(addrOf(c.Client.RemoteIp), c.Client.RemotePort),
			NetNS:       c.ClientNetns,
			ServerNetNS: c.ServerNetns,
		}
		if nowNs > c.StartNs {
			row.Age = time.Duration(nowNs - c.StartNs)
		}
		if members&memberBit(bypassSlRoleSL_ROLE_CLIENT) != 0 {
			row.Members = append(row.Members, "client")
		}
		if members&memberBit(bypassSlRoleSL_ROLE_SERVER) != 0 {
			row.Members = append(row.Members, "server")
		}
		dirs := [2]*Direction{&row.ClientToServer, &row.ServerToClient}
		for j, dd := range dirs {
			dd.Path = pathNames[c.Path[j]]
			dd.Msgs, dd.Bytes = c.Msgs[j], c.Bytes[j]
			dd.TCPMsgs, dd.TCPBytes = c.TcpMsgs[j], c.TcpBytes[j]
			if r := int(c.Reason[j]); r > 0 && r < len(names) {
				dd.Fallback = names[r]
			}
		}
		out = append(out, row)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Programs returns the datapath's programs (for their kernel statistics).
func (d *Datapath) Programs() []*ebpf.Program {
	out := []*ebpf.Program{d.objs.SlSockops, d.objs.SlMsg, d.objs.SlRelease}
	for _, p := range d.lbPrograms() {
		if *p != nil {
			out = append(out, *p)
		}
	}
	return out
}

// BriefDest is a destination whose connections from one network namespace
// were not worth joining the bypass: brief (one send each way, then close)
// or with no managed server (remote, or not attached).
type BriefDest struct {
	Dest  netip.AddrPort `json:"dest"`
	NetNS uint64         `json:"netns"`
	// InARow counts such connections in a row; from SL_BRIEF_LEARN on,
	// new connections to Dest from NetNS stay on TCP.
	InARow  uint32 `json:"in_a_row"`
	Skipped uint32 `json:"skipped"` // connections left on TCP since
	NoPeer  bool   `json:"no_peer"` // the last one found no managed server
	// ProbeEvery: one connection in this many still joins, as a probe
	// (doubling from SL_BRIEF_PROBE after each probe; at the latest one
	// second after the last connection that joined).
	ProbeEvery uint32 `json:"probe_every"`
}

// BriefDests reads what the datapath learned of brief connections.
func (d *Datapath) BriefDests() ([]BriefDest, error) {
	var out []BriefDest
	err := d.eachDest(func(k bypassSlDest, v bypassSlDestStat) {
		out = append(out, BriefDest{
			Dest:  netip.AddrPortFrom(addrOf(k.Ip), uint16(k.Port)),
			NetNS: k.Netns, InARow: v.Brief, Skipped: v.Skipped, NoPeer: v.Remote != 0,
			ProbeEvery: v.Every,
		})
	})
	return out, err
}

// eachDest calls fn for every entry of sl_brief.
func (d *Datapath) eachDest(fn func(bypassSlDest, bypassSlDestStat)) error {
	return eachEntry(d.objs.SlBrief, bypassMapSlBrief, fn)
}

// eachEntry calls fn for every entry of a hash map; what names the map in
// errors.
func eachEntry[K, V any](m *ebpf.Map, what string, fn func(K, V)) error {
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		fn(k, v)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading %s: %w", what, err)
	}
	return nil
}
