// Package testutil holds the gates of privileged tests and wraps the pod
// test bed for them.
package testutil

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/socklane/socklane/internal/testbed"
)

// InCI reports whether the tests run in CI, where nothing may be skipped.
func InCI() bool { return os.Getenv("CI") == "true" }

// RequireRoot skips outside CI when not root, and fails in CI.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Getenv(UnitEnv) != "" {
		t.Skip("skipped: a unit run (make unit) leaves out what needs root and the kernel")
	}
	if os.Geteuid() == 0 {
		return
	}
	if InCI() {
		t.Fatal("this test needs root and CI runs as root: run the suite as root")
	}
	t.Skip("skipped: needs root (loads BPF programs, creates network namespaces); run `sudo make test`")
}

// UnitEnv, set (make unit), skips every test that needs root and the
// kernel, as root too: the rest of every package runs in seconds.
const UnitEnv = "SOCKLANE_UNIT"

// RequireCommand skips outside CI when a program is missing, fails in CI.
func RequireCommand(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if InCI() {
		t.Fatalf("%s is not installed; .ci/run installs it", name)
	}
	t.Skipf("skipped: %s is not installed (apt-get install it, or run `make deps`)", name)
	return ""
}

// Bed creates a pod test bed removed when the test ends.
func Bed(t testing.TB) *testbed.Bed {
	t.Helper()
	RequireRoot(t)
	b, err := testbed.New()
	if err != nil {
		t.Fatalf("creating test bed: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("cleaning test bed: %v", err)
		}
	})
	return b
}

// Pod adds a pod to b.
func Pod(t testing.TB, b *testbed.Bed, name string) *testbed.Pod {
	t.Helper()
	p, err := b.AddPod(name)
	if err != nil {
		t.Fatalf("adding pod %s: %v", name, err)
	}
	return p
}

// HostPod adds a host-network pod to b.
func HostPod(t testing.TB, b *testbed.Bed, name string) *testbed.Pod {
	t.Helper()
	p, err := b.AddHostPod(name)
	if err != nil {
		t.Fatalf("adding host pod %s: %v", name, err)
	}
	return p
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// Binary builds the socklane command once per test process, or returns
// the prebuilt static one named by SOCKLANE_TEST_BINARY (the kernel matrix's
// guests have no Go toolchain).
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		if p := os.Getenv("SOCKLANE_TEST_BINARY"); p != "" {
			binPath = p
			if _, err := os.Stat(p); err != nil {
				buildErr = fmt.Errorf("SOCKLANE_TEST_BINARY: %w", err)
			}
			return
		}
		dir, err := os.MkdirTemp("", "socklane-test-bin")
		if err != nil {
			buildErr = err
			return
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "socklane")
		root, err := moduleRoot()
		if err != nil {
			buildErr = err
			return
		}
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/socklane")
		cmd.Dir = root
		// Static, so that container images can carry it too.
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building socklane: %v: %s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the test directory")
		}
		dir = parent
	}
}

// Instance is a socklane datapath instance of its own (own pin directory),
// removed with `down --force` when the test ends.
type Instance struct {
	t    testing.TB
	Bin  string
	Name string
	// Settings are datapath flags (--backlog-limit, --blocking-sockets)
	// passed to the attach that loads the datapath. They start with
	// --bypass on: the tests prove the bypass on every kernel, also where
	// auto leaves it off (TestBypassAuto proves that default).
	Settings []string
}

// NewInstance returns an instance named after the test.
func NewInstance(t testing.TB) *Instance {
	t.Helper()
	RequireRoot(t)
	name := fmt.Sprintf("sltest-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	in := &Instance{t: t, Bin: Binary(t), Name: name, Settings: []string{"--bypass", "on"}}
	t.Cleanup(func() {
		out, err := in.Run("down", "--force", "--ignore-not-found")
		if err != nil {
			t.Errorf("socklane down --force: %v: %s", err, out)
		}
	})
	return in
}

// Run runs socklane with this instance's name and returns combined output.
func (in *Instance) Run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, in.Bin, append([]string{"--name", in.Name}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// MustRun runs socklane and fails the test on error.
func (in *Instance) MustRun(args ...string) string {
	in.t.Helper()
	out, err := in.Run(args...)
	if err != nil {
		in.t.Fatalf("socklane %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// Attach attaches the instance to pods' cgroups.
func (in *Instance) Attach(pods ...*testbed.Pod) {
	in.t.Helper()
	for _, p := range pods {
		in.MustRun(append([]string{"attach", "--cgroup", p.Cgroup}, in.Settings...)...)
	}
}

// status reads `socklane status -o json`'s counters and bypassed sockets.
func (in *Instance) status() (map[string]uint64, int) {
	in.t.Helper()
	out := in.MustRun("status", "-o", "json")
	var st struct {
		Counters map[string]uint64 `json:"counters"`
		Sockets  int               `json:"bypassed_sockets"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		in.t.Fatalf("parsing status: %v\n%s", err, out)
	}
	return st.Counters, st.Sockets
}

// Counters reads the datapath counters through `socklane status -o json`.
func (in *Instance) Counters() map[string]uint64 {
	in.t.Helper()
	c, _ := in.status()
	return c
}

// Sockets is the number of sockets in the bypass map.
func (in *Instance) Sockets() int {
	in.t.Helper()
	_, n := in.status()
	return n
}

// Delta returns after-before for every counter.
func Delta(before, after map[string]uint64) map[string]uint64 {
	d := map[string]uint64{}
	for k, v := range after {
		d[k] = v - before[k]
	}
	return d
}

// ParseMetrics parses a Prometheus text exposition with the Prometheus
// text parser and returns every counter and gauge sample, keyed by name
// and then ",label=value" pairs in label-name order.
func ParseMetrics(text string) (map[string]float64, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for name, mf := range mfs {
		for _, m := range mf.Metric {
			key := name
			for _, l := range m.Label {
				key += "," + l.GetName() + "=" + l.GetValue()
			}
			switch {
			case m.Counter != nil:
				out[key] = m.Counter.GetValue()
			case m.Gauge != nil:
				out[key] = m.Gauge.GetValue()
			case m.Histogram != nil:
				out[key+"_count"] = float64(m.Histogram.GetSampleCount())
				out[key+"_sum"] = m.Histogram.GetSampleSum()
			}
		}
	}
	return out, nil
}

// FreeAddr returns a loopback address ("127.0.0.1:port") whose port was
// free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// MapEntries counts the entries of one of the instance's pinned maps.
func (in *Instance) MapEntries(name string) int {
	in.t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join("/sys/fs/bpf", in.Name, name), nil)
	if err != nil {
		in.t.Fatal(err)
	}
	defer m.Close()
	k, v := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
	n := 0
	for it := m.Iterate(); it.Next(&k, &v); {
		n++
	}
	return n
}
