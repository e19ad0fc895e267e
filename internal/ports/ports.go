// Package ports is socklane's port virtualization model: workloads (a
// cgroup, a process, a pod or a label selector), the virtual ports each
// binds and the pool of real ports they draw from, and routes that choose
// which copy a connection from elsewhere reaches. Parse validates a YAML
// source in full; Compile turns a validated set into the datapath's tables.
package ports

import (
	"cmp"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/socklane/socklane/internal/cri"
	"github.com/socklane/socklane/internal/yamlsrc"
	"gopkg.in/yaml.v3"
)

// File is the YAML source:
//
//	workloads:
//	  - name: redis-a
//	    cgroup: /sys/fs/cgroup/ci/a     # or pid: N, pod: NS/NAME (container: C), selector: k=v
//	    ports:
//	      - {port: 3000, protocol: TCP}
//	      - {port: 7000-7010, protocol: UDP}
//	      - {port: 0}                   # binds to port 0 draw from the pool too
//	    pool: 41000-41999
//	    reuseAfterSeconds: 60           # a released port rests this long (TIME_WAIT)
//	    addresses: [198.19.9.1]         # connects to these (any virtual port) reach this copy from anywhere
//	routes:
//	  - {port: 3000, protocol: TCP, to: redis-a}  # connects from elsewhere reach this copy
type File struct {
	Workloads []*Workload `yaml:"workloads"`
	Routes    []*Route    `yaml:"routes"`
}

// Workload is one copy of a program and its ports.
type Workload struct {
	Name      string `yaml:"name" json:"name"`
	Cgroup    string `yaml:"cgroup,omitempty" json:"cgroup,omitempty"`
	PID       int    `yaml:"pid,omitempty" json:"pid,omitempty"`
	Pod       string `yaml:"pod,omitempty" json:"pod,omitempty"`
	Container string `yaml:"container,omitempty" json:"container,omitempty"`
	Selector  string `yaml:"selector,omitempty" json:"selector,omitempty"`
	Ports     []Port `yaml:"ports" json:"ports"`
	Pool      Range  `yaml:"pool" json:"pool"`
	// ReuseAfter is how long a released real port rests before another
	// bind gets it, in seconds (nil: DefaultReuseAfter).
	ReuseAfter *int `yaml:"reuseAfterSeconds,omitempty" json:"reuseAfterSeconds,omitempty"`
	// Addresses reach this copy's virtual ports from any socket
	// socklane hooks (no packet is ever sent to them): give the
	// workload's name to them in DNS or /etc/hosts (`ports hosts`).
	Addresses []netip.Addr `yaml:"addresses,omitempty" json:"addresses,omitempty"`
}

// Port is a virtual port (or range) of one protocol.
type Port struct {
	Port     Range  `yaml:"port" json:"port"`
	Protocol string `yaml:"protocol,omitempty" json:"protocol"`
}

// Route sends connections to a virtual port from sockets of no workload
// having it to one workload's copy.
type Route struct {
	Port     int    `yaml:"port" json:"port"`
	Protocol string `yaml:"protocol,omitempty" json:"protocol"`
	To       string `yaml:"to" json:"to"`
}

// Range is a port or an inclusive range of ports: 3000 or "3000-3010".
type Range struct{ Lo, Hi int }

func (r Range) String() string {
	if r.Lo == r.Hi {
		return strconv.Itoa(r.Lo)
	}
	return fmt.Sprintf("%d-%d", r.Lo, r.Hi)
}

// Len is the number of ports in r.
func (r Range) Len() int { return r.Hi - r.Lo + 1 }

func (r Range) overlaps(o Range) bool { return r.Lo <= o.Hi && o.Lo <= r.Hi }

// ParseRange reads "N" or "N-M".
func ParseRange(s string) (Range, error) {
	lo, hi, isRange := strings.Cut(strings.TrimSpace(s), "-")
	a, err := strconv.Atoi(strings.TrimSpace(lo))
	if err != nil {
		return Range{}, fmt.Errorf("%q is not a port or a range N-M", s)
	}
	b := a
	if isRange {
		if b, err = strconv.Atoi(strings.TrimSpace(hi)); err != nil {
			return Range{}, fmt.Errorf("%q is not a port or a range N-M", s)
		}
	}
	if a < 0 || b > 65535 || a > b {
		return Range{}, fmt.Errorf("%q: ports are 0..65535, the first no larger than the last", s)
	}
	return Range{a, b}, nil
}

// UnmarshalYAML accepts a number or a "N-M" string.
func (r *Range) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseRange(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*r = v
	return nil
}

// MarshalText writes r as ParseRange reads it.
func (r Range) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads what MarshalText wrote.
func (r *Range) UnmarshalText(b []byte) error {
	v, err := ParseRange(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// DefaultReuseAfter is how long a released real port rests by default:
// Linux's TIME_WAIT, during which the connections it served still hold it.
const DefaultReuseAfter = 60

// MaxReuseAfter bounds reuseAfterSeconds.
const MaxReuseAfter = 3600

// Set is a validated source.
type Set struct {
	Workloads []*Workload `json:"workloads"`
	Routes    []*Route    `json:"routes"`
}

// Workload returns the named workload, or nil.
func (s *Set) Workload(name string) *Workload {
	for _, w := range s.Workloads {
		if w.Name == name {
			return w
		}
	}
	return nil
}

// ReuseAfterSeconds is w's rest time with the default applied.
func (w *Workload) ReuseAfterSeconds() int {
	if w.ReuseAfter == nil {
		return DefaultReuseAfter
	}
	return *w.ReuseAfter
}

// Has reports whether w has virtual port p of proto.
func (w *Workload) Has(p int, proto string) bool {
	for _, q := range w.Ports {
		if q.Protocol == proto && q.Port.Lo <= p && p <= q.Port.Hi {
			return true
		}
	}
	return false
}

// Parse reads and validates a YAML source. Every problem is reported with
// its line and field; a source with any problem yields no Set.
func Parse(src []byte) (*Set, error) {
	idx, err := yamlsrc.Read(src, "ports")
	if err != nil {
		return nil, err
	}
	var f File
	if err := yamlsrc.DecodeStrict(src, "ports", &f); err != nil {
		return nil, err
	}
	return validate(&f, idx.Line)
}

// ParseFile is Parse on a file's contents.
func ParseFile(path string) (*Set, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading ports file: %w", err)
	}
	set, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return set, nil
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

func normProto(p string) (string, bool) {
	switch strings.ToUpper(p) {
	case "", "TCP":
		return "TCP", true
	case "UDP":
		return "UDP", true
	}
	return p, false
}

// validate checks f in full and returns its set with defaults filled in.
func validate(f *File, line func(string) int) (*Set, error) {
	var errs yamlsrc.Errors
	bad := func(field, format string, a ...any) {
		errs = append(errs, &yamlsrc.FieldError{Line: line(field), Field: field, Msg: fmt.Sprintf(format, a...)})
	}
	names := map[string]bool{}
	type used struct {
		r     Range
		field string
	}
	var virtual []used
	for i, w := range f.Workloads {
		at := fmt.Sprintf("workloads[%d]", i)
		if w == nil {
			bad(at, "empty workload")
			continue
		}
		switch {
		case !dnsLabel.MatchString(w.Name):
			bad(at+".name", "%q is not a DNS label (lower case letters, digits and '-', at most 63)", w.Name)
		case names[w.Name]:
			bad(at+".name", "%q is defined twice", w.Name)
		}
		names[w.Name] = true
		n := 0
		for _, set := range []bool{w.Cgroup != "", w.PID != 0, w.Pod != "", w.Selector != ""} {
			if set {
				n++
			}
		}
		if n != 1 {
			bad(at, "give exactly one of cgroup, pid, pod or selector")
		}
		if w.Cgroup != "" && !strings.HasPrefix(w.Cgroup, "/") {
			bad(at+".cgroup", "%q is not an absolute path", w.Cgroup)
		}
		if w.PID < 0 {
			bad(at+".pid", "%d is not a process id", w.PID)
		}
		if w.Pod != "" && strings.Count(w.Pod, "/") != 1 {
			bad(at+".pod", "%q: want NAMESPACE/NAME", w.Pod)
		}
		if w.Container != "" && w.Pod == "" {
			bad(at+".container", "needs pod")
		}
		if w.Selector != "" {
			if _, err := cri.ParseSelector(w.Selector); err != nil {
				bad(at+".selector", "%v", err)
			}
		}
		if len(w.Ports) == 0 {
			bad(at+".ports", "no virtual ports")
		}
		for j := range w.Ports {
			p := &w.Ports[j]
			pat := fmt.Sprintf("%s.ports[%d]", at, j)
			proto, ok := normProto(p.Protocol)
			if !ok {
				bad(pat+".protocol", "%q: want TCP or UDP", p.Protocol)
			}
			p.Protocol = proto
			if p.Port.Lo == 0 && p.Port.Hi != 0 {
				bad(pat+".port", "port 0 stands alone (binds to port 0), not in a range")
			}
			for k := range j {
				q := w.Ports[k]
				if q.Protocol == proto && q.Port.overlaps(p.Port) {
					bad(pat+".port", "%s/%s overlaps ports[%d] (%s)", p.Port, proto, k, q.Port)
				}
			}
			if p.Port.Lo > 0 {
				virtual = append(virtual, used{p.Port, pat + ".port"})
			}
		}
		if w.Pool.Lo < 1024 {
			bad(at+".pool", "give a pool of real ports N-M within 1024..65535 (got %q)", w.Pool)
		}
		if r := w.ReuseAfter; r != nil && (*r < 0 || *r > MaxReuseAfter) {
			bad(at+".reuseAfterSeconds", "%d: want 0..%d", *r, MaxReuseAfter)
		}
	}
	// A real port must never be mistaken for a virtual one.
	for i, w := range f.Workloads {
		if w == nil || w.Pool.Lo < 1024 {
			continue
		}
		for _, v := range virtual {
			if v.r.overlaps(w.Pool) {
				bad(fmt.Sprintf("workloads[%d].pool", i), "%s overlaps the virtual ports at %s (%s): a pool holds real ports only", w.Pool, v.field, v.r)
			}
		}
	}
	addrs := map[netip.Addr]string{}
	for i, w := range f.Workloads {
		if w == nil {
			continue
		}
		for j, a := range w.Addresses {
			at := fmt.Sprintf("workloads[%d].addresses[%d]", i, j)
			a = a.Unmap()
			w.Addresses[j] = a
			switch {
			case !a.IsValid() || a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a.IsLinkLocalUnicast():
				bad(at, "%s: want a unicast address that is not loopback, unspecified or link-local", a)
			case addrs[a] != "":
				bad(at, "%s is %s's already", a, addrs[a])
			}
			addrs[a] = w.Name
		}
	}
	routes := map[string]bool{}
	for i, r := range f.Routes {
		at := fmt.Sprintf("routes[%d]", i)
		if r == nil {
			bad(at, "empty route")
			continue
		}
		proto, ok := normProto(r.Protocol)
		if !ok {
			bad(at+".protocol", "%q: want TCP or UDP", r.Protocol)
		}
		r.Protocol = proto
		if r.Port < 1 || r.Port > 65535 {
			bad(at+".port", "%d: want 1..65535", r.Port)
		}
		key := fmt.Sprintf("%d/%s", r.Port, proto)
		if routes[key] {
			bad(at, "a second route for %s", key)
		}
		routes[key] = true
		var to *Workload
		for _, w := range f.Workloads {
			if w != nil && w.Name == r.To {
				to = w
			}
		}
		switch {
		case to == nil:
			bad(at+".to", "%q is not a workload of this file", r.To)
		case !to.Has(r.Port, proto):
			bad(at+".to", "workload %q has no virtual port %s", r.To, key)
		}
	}
	if len(errs) > 0 {
		slices.SortStableFunc(errs, func(a, b *yamlsrc.FieldError) int { return cmp.Compare(a.Line, b.Line) })
		return nil, errs
	}
	set := &Set{Workloads: f.Workloads, Routes: f.Routes}
	if set.Workloads == nil {
		set.Workloads = []*Workload{}
	}
	if set.Routes == nil {
		set.Routes = []*Route{}
	}
	return set, nil
}
