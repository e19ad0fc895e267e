// Package testbed builds pods on this node the way a Kubernetes node has
// them: a network namespace per pod, a veth pair into a node bridge (with
// bridge-nf on), and a cgroup v2 directory per pod. Used by the tests, the demo
// and the benchmarks. Addresses come from 198.18.0.0/16 (and 2001:db8:18::/48, the documentation range).
package testbed

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/socklane/socklane/internal/cgroups"
	"golang.org/x/sys/unix"
)

const maxBeds = 200

// Bed is a node bridge with its pods.
type Bed struct {
	Index     int
	Bridge    string
	GatewayV4 netip.Addr
	GatewayV6 netip.Addr
	// CgroupDir holds the pods' cgroups.
	CgroupDir string
	Pods      []*Pod
	cleanups  []func() error
}

// Pod is a network namespace plus a cgroup. A host pod has only the cgroup
// and lives in the node's network namespace.
type Pod struct {
	Name     string
	NetNS    string // path under /var/run/netns; empty for a host pod
	IPv4     netip.Addr
	IPv6     netip.Addr
	Cgroup   string
	CgroupID uint64

	pendingFDs []int
}

func run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// New creates a bed: the first free bridge slbrN, its addresses and a cgroup
// directory. Close removes everything it made.
func New() (*Bed, error) {
	root, err := cgroups.Root()
	if err != nil {
		return nil, err
	}
	b := &Bed{}
	for i := 1; i <= maxBeds; i++ {
		name := fmt.Sprintf("slbr%d", i)
		// Creation is the lock: a bridge that exists belongs to someone else.
		if err := run("ip", "link", "add", name, "type", "bridge"); err != nil {
			continue
		}
		b.Index, b.Bridge = i, name
		break
	}
	if b.Bridge == "" {
		return nil, errors.New("no free test bridge name (slbr1..slbr200 all exist: remove stale ones)")
	}
	b.cleanups = append(b.cleanups, func() error { return run("ip", "link", "del", b.Bridge) })
	ok := false
	defer func() {
		if !ok {
			b.Close()
		}
	}()
	b.GatewayV4 = netip.AddrFrom4([4]byte{198, 18, byte(b.Index), 1})
	b.GatewayV6 = v6(b.Index, 1)
	for _, args := range [][]string{
		{"ip", "addr", "add", b.GatewayV4.String() + "/24", "dev", b.Bridge},
		{"ip", "-6", "addr", "add", b.GatewayV6.String() + "/64", "dev", b.Bridge, "nodad"},
		{"ip", "link", "set", b.Bridge, "up"},
	} {
		if err := run(args...); err != nil {
			return nil, err
		}
	}
	if err := b.bridgeNetfilter(); err != nil {
		return nil, err
	}
	b.CgroupDir = filepath.Join(root, "socklane-testbed", b.Bridge)
	if err := os.MkdirAll(b.CgroupDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating cgroup %s: %w", b.CgroupDir, err)
	}
	b.cleanups = append(b.cleanups, func() error {
		if err := removeCgroup(b.CgroupDir); err != nil {
			return err
		}
		// The shared parent goes with the last bed; another bed still
		// in it keeps it (ENOTEMPTY/EBUSY).
		_ = unix.Rmdir(filepath.Dir(b.CgroupDir))
		return nil
	})
	ok = true
	return b, nil
}

func v6(bed, host int) netip.Addr {
	return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 0x18, 0, byte(bed), 0, 0, 0, 0, 0, 0, 0, byte(host)})
}

// bridgeNetfilter makes bridged traffic traverse iptables, as on a
// Kubernetes node, and lets it through the FORWARD chain.
func (b *Bed) bridgeNetfilter() error {
	const knob = "/proc/sys/net/bridge/bridge-nf-call-iptables"
	if _, err := os.Stat(knob); err != nil {
		_ = run("modprobe", "br_netfilter")
	}
	if old, err := os.ReadFile(knob); err == nil {
		if strings.TrimSpace(string(old)) != "1" {
			if err := os.WriteFile(knob, []byte("1"), 0o644); err != nil {
				return fmt.Errorf("enabling bridge-nf: %w", err)
			}
			b.cleanups = append(b.cleanups, func() error { return os.WriteFile(knob, old, 0o644) })
		}
	}
	rule := []string{"FORWARD", "-i", b.Bridge, "-o", b.Bridge, "-j", "ACCEPT"}
	// The bridge name is ours alone while the bridge exists, so a rule
	// for it already there was left by a bed that was killed: it goes.
	dropForwardRule(rule)
	if err := run(append([]string{"iptables", "-w", "-I"}, rule...)...); err == nil {
		b.cleanups = append(b.cleanups, func() error {
			if n := dropForwardRule(rule); n == 0 {
				return fmt.Errorf("removing the FORWARD rule of %s: not found", b.Bridge)
			}
			return nil
		})
	}
	return nil
}

// dropForwardRule deletes every copy of rule and returns how many it
// deleted.
func dropForwardRule(rule []string) int {
	n := 0
	for ; n < 100; n++ {
		if run(append([]string{"iptables", "-w", "-D"}, rule...)...) != nil {
			break
		}
	}
	return n
}

// BridgeNetfilter reports whether bridged traffic goes through iptables.
func BridgeNetfilter() bool {
	v, err := os.ReadFile("/proc/sys/net/bridge/bridge-nf-call-iptables")
	return err == nil && strings.TrimSpace(string(v)) == "1"
}

// AddPod creates a pod: netns, veth into the bridge, addresses, cgroup.
func (b *Bed) AddPod(name string) (*Pod, error) {
	n := len(b.Pods) + 2
	p := &Pod{
		Name: name,
		IPv4: netip.AddrFrom4([4]byte{198, 18, byte(b.Index), byte(n)}),
		IPv6: v6(b.Index, n),
	}
	ns := fmt.Sprintf("%s-%s", b.Bridge, name)
	if err := run("ip", "netns", "add", ns); err != nil {
		return nil, err
	}
	b.cleanups = append(b.cleanups, func() error { return run("ip", "netns", "del", ns) })
	p.NetNS = filepath.Join("/var/run/netns", ns)
	host := fmt.Sprintf("sl%dp%d", b.Index, n)
	// Deleted explicitly: the kernel destroys a namespace's devices
	// asynchronously, and the next bed may want the same name at once.
	b.cleanups = append(b.cleanups, func() error {
		if _, err := os.Stat("/sys/class/net/" + host); err != nil {
			return nil
		}
		return run("ip", "link", "del", host)
	})
	for _, args := range [][]string{
		{"ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"ip", "link", "set", host, "master", b.Bridge, "up"},
		{"ip", "-n", ns, "link", "set", "lo", "up"},
		{"ip", "-n", ns, "addr", "add", p.IPv4.String() + "/24", "dev", "eth0"},
		{"ip", "-n", ns, "-6", "addr", "add", p.IPv6.String() + "/64", "dev", "eth0", "nodad"},
		{"ip", "-n", ns, "link", "set", "eth0", "up"},
		{"ip", "-n", ns, "route", "add", "default", "via", b.GatewayV4.String()},
		{"ip", "-n", ns, "-6", "route", "add", "default", "via", b.GatewayV6.String()},
	} {
		if err := run(args...); err != nil {
			return nil, err
		}
	}
	if err := b.addCgroup(p); err != nil {
		return nil, err
	}
	b.Pods = append(b.Pods, p)
	return p, nil
}

// AddHostPod creates a cgroup for processes in the node's own network
// namespace (a hostNetwork pod, or any host process).
func (b *Bed) AddHostPod(name string) (*Pod, error) {
	p := &Pod{Name: name, IPv4: b.GatewayV4, IPv6: b.GatewayV6}
	if err := b.addCgroup(p); err != nil {
		return nil, err
	}
	b.Pods = append(b.Pods, p)
	return p, nil
}

func (b *Bed) addCgroup(p *Pod) error {
	p.Cgroup = filepath.Join(b.CgroupDir, p.Name)
	if err := os.Mkdir(p.Cgroup, 0o755); err != nil {
		return fmt.Errorf("creating cgroup %s: %w", p.Cgroup, err)
	}
	id, err := cgroups.ID(p.Cgroup)
	if err != nil {
		return err
	}
	p.CgroupID = id
	return nil
}

// RouteNowhere makes the pod's connects to prefix fail at once
// (EHOSTUNREACH) instead of leaving the machine through the host's
// default route: for tests of addresses nobody translates (a deleted
// Service, a pod left to kube-proxy). Only a pod with its own network
// namespace.
func (p *Pod) RouteNowhere(prefix string) error {
	if p.NetNS == "" {
		return fmt.Errorf("pod %s shares the host's network namespace", p.Name)
	}
	return run("ip", "-n", filepath.Base(p.NetNS), "route", "add", "unreachable", prefix)
}

// Command returns a command that starts inside the pod: in its cgroup from
// the first instruction (clone3 CLONE_INTO_CGROUP) and in its network
// namespace. The caller starts it and must wait for it.
func (p *Pod) Command(name string, args ...string) (*exec.Cmd, error) {
	fd, err := unix.Open(p.Cgroup, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening cgroup %s: %w", p.Cgroup, err)
	}
	var cmd *exec.Cmd
	if p.NetNS != "" {
		cmd = exec.Command("nsenter", append([]string{"--net=" + p.NetNS, "--", name}, args...)...)
	} else {
		cmd = exec.Command(name, args...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd, Pdeathsig: syscall.SIGKILL}
	// Kept open until the bed closes: exec.Cmd uses it at Start.
	p.pendingFDs = append(p.pendingFDs, fd)
	return cmd, nil
}

// Close kills the bed's processes and removes what New and AddPod made, in
// reverse order. It reports every failure.
func (b *Bed) Close() error {
	var errs []error
	for _, p := range b.Pods {
		for _, fd := range p.pendingFDs {
			unix.Close(fd)
		}
		p.pendingFDs = nil
		if p.Cgroup != "" {
			if err := removeCgroup(p.Cgroup); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for i := len(b.cleanups) - 1; i >= 0; i-- {
		if err := b.cleanups[i](); err != nil {
			errs = append(errs, err)
		}
	}
	b.cleanups = nil
	b.Pods = nil
	return errors.Join(errs...)
}

// removeCgroup kills what runs in a cgroup tree and removes it.
func removeCgroup(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0o644)
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() {
			_ = removeCgroup(filepath.Join(dir, e.Name()))
		}
	}
	var err error
	for i := 0; i < 100; i++ {
		if err = unix.Rmdir(dir); err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("removing cgroup %s: %w", dir, err)
}
