package statesync

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/socklane/socklane/internal/syncpb"
)

// Defaults of a Config.
const (
	DefaultLogSize          = 1 << 20
	DefaultPollInterval     = time.Second
	DefaultDigestInterval   = 10 * time.Second
	DefaultTombstoneTTL     = 10 * time.Minute
	DefaultBootstrapTimeout = 10 * time.Second
	DefaultTakeoverTimeout  = 10 * time.Second
	heartbeatInterval       = time.Second
	redialInterval          = 200 * time.Millisecond
)

// Config of a node's state sync.
type Config struct {
	// Node is this node's name: the identity in its certificate, the
	// same name its peers list.
	Node string
	// Listen is where peers connect ("host:port").
	Listen string
	// Peers are the other nodes (static list).
	Peers []Peer
	// DiscoverPeers: the peers come from SetPeers instead, found through
	// the Kubernetes API as PeersFrom (NAMESPACE/SELECTOR) says.
	DiscoverPeers bool
	PeersFrom     string
	// TLS names the CA, certificate and key files (read again at every
	// handshake, so a renewed certificate is used without a restart).
	TLS TLSFiles
	// Tables are the synced maps.
	Tables []TableConfig
	// LogSize is how many of its own changes a node keeps for resending.
	LogSize int
	// DigestInterval is how often each node sends digests of what it
	// originated (0: DefaultDigestInterval).
	DigestInterval time.Duration
	// TombstoneTTL is how long a delete is remembered.
	TombstoneTTL time.Duration
	// BootstrapTimeout bounds the wait for the peers' snapshots before
	// the first read of the local maps.
	BootstrapTimeout time.Duration
	// TakeoverTimeout bounds how long a node that won the lease waits to
	// hear from its peers before it takes over with what it has.
	TakeoverTimeout time.Duration
	// Active: this node is the active one of MODE_ACTIVE_STANDBY tables
	// (without a lease; see Elector).
	Active bool
}

// Peer is another node.
type Peer struct {
	Name    string
	Address string
}

// TLSFiles are PEM files.
type TLSFiles struct {
	CA, Cert, Key string
}

// TableConfig is a synced map.
type TableConfig struct {
	// Name is the table's name on every node (default: the pin's base
	// name).
	Name string
	// Path is the pinned map.
	Path string
	// Mode: shared (every node writes) or active-standby.
	Mode syncpb.Mode
	// Poll is how often the map is read and diffed against what was
	// synced (the way to capture writes nothing reports). With Changes,
	// the map is read only when records were lost (0: DefaultPollInterval).
	Poll time.Duration
	// Changes is a bpffs directory holding the ring buffer of change
	// records (sl_sync_changes) and its loss counter (sl_sync_lost) that
	// the writing programs fill (sl_sync.h).
	Changes string
	// Record is the table number the writing programs put in their
	// records for this map.
	Record uint32
	// NoTrace: without Changes, read the map every Poll even where the
	// kernel's map updates can be traced (the tracer costs every write
	// of every map of the type on the node a trampoline).
	NoTrace bool
}

var nodeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`)

// ParsePeer reads NAME=HOST:PORT.
func ParsePeer(s string) (Peer, error) {
	name, addr, ok := strings.Cut(s, "=")
	if !ok || name == "" || addr == "" {
		return Peer{}, fmt.Errorf("--sync-peer %q: want NAME=HOST:PORT (the peer's node name, as in its certificate, and its --sync-listen address)", s)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return Peer{}, fmt.Errorf("--sync-peer %q: %w", s, err)
	}
	return Peer{Name: name, Address: addr}, nil
}

// ParseTable reads PATH[,name=NAME][,mode=shared|active-standby][,poll=DURATION][,changes=DIR][,record=N][,trace=on|off].
func ParseTable(s string) (TableConfig, error) {
	parts := strings.Split(s, ",")
	t := TableConfig{Path: parts[0], Mode: syncpb.Mode_MODE_SHARED}
	fail := func(why string) (TableConfig, error) {
		return TableConfig{}, fmt.Errorf("--sync-map %q: %s (want PATH[,name=NAME][,mode=shared|active-standby][,poll=1s][,changes=DIR][,record=N][,trace=on|off])", s, why)
	}
	if !strings.HasPrefix(t.Path, "/") {
		return fail("the pinned map's path must be absolute")
	}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return fail(fmt.Sprintf("%q is not key=value", p))
		}
		switch k {
		case "name":
			t.Name = v
		case "mode":
			switch v {
			case "shared":
				t.Mode = syncpb.Mode_MODE_SHARED
			case "active-standby":
				t.Mode = syncpb.Mode_MODE_ACTIVE_STANDBY
			default:
				return fail("mode " + v + " is neither shared nor active-standby")
			}
		case "poll":
			d, err := time.ParseDuration(v)
			if err != nil || d < 10*time.Millisecond {
				return fail("poll " + v + " is not a duration of at least 10ms")
			}
			t.Poll = d
		case "changes":
			t.Changes = v
		case "trace":
			switch v {
			case "on":
				t.NoTrace = false
			case "off":
				t.NoTrace = true
			default:
				return fail("trace " + v + " is neither on nor off")
			}
		case "record":
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return fail("record " + v + " is not a number")
			}
			t.Record = uint32(n)
		default:
			return fail("unknown option " + k)
		}
	}
	if t.Name == "" {
		t.Name = filepath.Base(t.Path)
	}
	return t, nil
}

func (c *Config) setDefaults() {
	if c.LogSize == 0 {
		c.LogSize = DefaultLogSize
	}
	if c.DigestInterval == 0 {
		c.DigestInterval = DefaultDigestInterval
	}
	if c.TombstoneTTL == 0 {
		c.TombstoneTTL = DefaultTombstoneTTL
	}
	if c.BootstrapTimeout == 0 {
		c.BootstrapTimeout = DefaultBootstrapTimeout
	}
	if c.TakeoverTimeout == 0 {
		c.TakeoverTimeout = DefaultTakeoverTimeout
	}
	for i := range c.Tables {
		if c.Tables[i].Poll == 0 {
			c.Tables[i].Poll = DefaultPollInterval
		}
	}
}

// Validate checks what needs neither the kernel nor the files.
func (c Config) Validate() error {
	if !nodeName.MatchString(c.Node) {
		return fmt.Errorf("--node-name %q: the sync needs this node's name (lower-case letters, digits, '-' and '.'), the identity in its certificate", c.Node)
	}
	if c.Listen == "" {
		return errors.New("--sync-listen: give the address peers connect to (HOST:PORT)")
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("--sync-listen %q: %w", c.Listen, err)
	}
	if c.TLS.CA == "" || c.TLS.Cert == "" || c.TLS.Key == "" {
		return errors.New("--sync-ca, --sync-cert and --sync-key: the sync runs only over mutual TLS (socklane sync certs makes a CA and node certificates)")
	}
	if len(c.Tables) == 0 {
		return errors.New("--sync-map: name at least one pinned map to sync")
	}
	if c.DiscoverPeers && len(c.Peers) > 0 {
		return errors.New("--sync-peer and --sync-peers-from: give the peers one way")
	}
	seen := map[string]bool{}
	for _, p := range c.Peers {
		if p.Name == c.Node {
			return fmt.Errorf("--sync-peer %s: that is this node", p.Name)
		}
		if seen[p.Name] {
			return fmt.Errorf("--sync-peer %s: given twice", p.Name)
		}
		seen[p.Name] = true
	}
	names, rings := map[string]bool{}, map[string]string{}
	for _, t := range c.Tables {
		if names[t.Name] {
			return fmt.Errorf("--sync-map: two tables named %s (give name=)", t.Name)
		}
		names[t.Name] = true
		if t.Changes == "" {
			continue
		}
		if other, ok := rings[filepath.Clean(t.Changes)]; ok {
			return fmt.Errorf("--sync-map: tables %s and %s both read changes=%s: one ring buffer per map (each table's reader would take records the other needs)", other, t.Name, t.Changes)
		}
		rings[filepath.Clean(t.Changes)] = t.Name
	}
	if c.LogSize < 0 || (c.LogSize > 0 && c.LogSize < 1024) {
		return fmt.Errorf("--sync-log-size %d: want at least 1024", c.LogSize)
	}
	return nil
}
