// Package sockdiag finds and destroys TCP and UDP sockets through the
// kernel's sock_diag netlink interface: dumps carry each socket's cookie
// (the value BPF programs get from bpf_get_socket_cookie), and
// SOCK_DESTROY (CONFIG_INET_DIAG_DESTROY) aborts a socket as `ss -K`
// does: its owner's next call fails with ECONNABORTED, and a TCP peer
// gets a reset.
package sockdiag

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// Sizes of the kernel's structures (linux/inet_diag.h, linux/netlink.h).
const (
	sizeofNlmsghdr = 16
	sizeofSockID   = 48
	sizeofReqV2    = 8 + sizeofSockID
	sizeofDiagMsg  = 4 + sizeofSockID + 20
)

// allStates selects sockets in every TCP state (connected UDP sockets are
// TCP_ESTABLISHED, unconnected ones TCP_CLOSE).
const allStates = 0xffffffff

// ID is the kernel's inet_diag_sockid: a socket's addresses and cookie.
// Addresses are kept as the kernel lays them out (IPv4 in the first four
// bytes); ports are in host order here.
type ID struct {
	SrcPort, DstPort uint16
	Src, Dst         [16]byte
	If               uint32
	Cookie           uint64
}

// Socket is one socket of a dump.
type Socket struct {
	Family   uint8 // AF_INET or AF_INET6
	Protocol uint8 // IPPROTO_TCP or IPPROTO_UDP (from the request)
	State    uint8 // TCP state numbering
	ID       ID
	Inode    uint32
}

func addr(family uint8, b [16]byte, port uint16) netip.AddrPort {
	if family == unix.AF_INET {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[:4])), port)
	}
	return netip.AddrPortFrom(netip.AddrFrom16(b).Unmap(), port)
}

// Local is the socket's own address.
func (s Socket) Local() netip.AddrPort { return addr(s.Family, s.ID.Src, s.ID.SrcPort) }

// Remote is the socket's peer address.
func (s Socket) Remote() netip.AddrPort { return addr(s.Family, s.ID.Dst, s.ID.DstPort) }

func putID(b []byte, id ID) {
	binary.BigEndian.PutUint16(b[0:], id.SrcPort)
	binary.BigEndian.PutUint16(b[2:], id.DstPort)
	copy(b[4:20], id.Src[:])
	copy(b[20:36], id.Dst[:])
	binary.NativeEndian.PutUint32(b[36:], id.If)
	binary.NativeEndian.PutUint32(b[40:], uint32(id.Cookie))
	binary.NativeEndian.PutUint32(b[44:], uint32(id.Cookie>>32))
}

func getID(b []byte) ID {
	var id ID
	id.SrcPort = binary.BigEndian.Uint16(b[0:])
	id.DstPort = binary.BigEndian.Uint16(b[2:])
	copy(id.Src[:], b[4:20])
	copy(id.Dst[:], b[20:36])
	id.If = binary.NativeEndian.Uint32(b[36:])
	id.Cookie = uint64(binary.NativeEndian.Uint32(b[40:])) | uint64(binary.NativeEndian.Uint32(b[44:]))<<32
	return id
}

// request builds one netlink message carrying an inet_diag_req_v2.
func request(typ, flags uint16, seq uint32, family, proto uint8, id ID) []byte {
	b := make([]byte, sizeofNlmsghdr+sizeofReqV2)
	binary.NativeEndian.PutUint32(b[0:], uint32(len(b)))
	binary.NativeEndian.PutUint16(b[4:], typ)
	binary.NativeEndian.PutUint16(b[6:], flags)
	binary.NativeEndian.PutUint32(b[8:], seq)
	r := b[sizeofNlmsghdr:]
	r[0], r[1] = family, proto
	binary.NativeEndian.PutUint32(r[4:], allStates)
	putID(r[8:], id)
	return b
}

// errDone ends a dump.
var errDone = errors.New("end of dump")

// parse reads the netlink messages of one receive. It returns the sockets
// found; errDone once the dump (or an acknowledged request) has ended; or
// the kernel's error.
func parse(b []byte, proto uint8) ([]Socket, error) {
	var out []Socket
	for len(b) > 0 {
		if len(b) < sizeofNlmsghdr {
			return out, fmt.Errorf("netlink message truncated: %d bytes", len(b))
		}
		n := int(binary.NativeEndian.Uint32(b[0:]))
		typ := binary.NativeEndian.Uint16(b[4:])
		if n < sizeofNlmsghdr || n > len(b) {
			return out, fmt.Errorf("netlink message length %d out of range (%d bytes left)", n, len(b))
		}
		body := b[sizeofNlmsghdr:n]
		switch typ {
		case unix.NLMSG_DONE:
			return out, errDone
		case unix.NLMSG_ERROR:
			if len(body) < 4 {
				return out, errors.New("netlink error message truncated")
			}
			if e := int32(binary.NativeEndian.Uint32(body)); e != 0 {
				return out, syscall.Errno(-e)
			}
			return out, errDone // an acknowledgement
		case unix.SOCK_DIAG_BY_FAMILY:
			if len(body) < sizeofDiagMsg {
				return out, fmt.Errorf("inet_diag_msg truncated: %d bytes", len(body))
			}
			out = append(out, Socket{
				Family:   body[0],
				Protocol: proto,
				State:    body[1],
				ID:       getID(body[4:]),
				Inode:    binary.NativeEndian.Uint32(body[4+sizeofSockID+16:]),
			})
		}
		// Messages are aligned to 4 bytes.
		adv := (n + 3) &^ 3
		if adv > len(b) {
			adv = len(b)
		}
		b = b[adv:]
	}
	return out, nil
}
