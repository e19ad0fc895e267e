package datapath

import (
	"fmt"
	"net/netip"
	"time"

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
			Client:      netip.AddrPortFrom(wordsAddr(c.Client.LocalIp), c.Client.LocalPort),
			Server:      netip.AddrPortFrom(wordsAddr(c.Client.RemoteIp), c.Client.RemotePort),
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
