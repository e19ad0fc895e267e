package agent

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/service"
)

// TestValidate: every configuration the agent cannot run is refused
// before it touches the node, naming the flag.
func TestValidate(t *testing.T) {
	ok := Config{Config: node.Config{Settings: datapath.DefaultSettings()}}
	for _, tt := range []struct {
		name string
		edit func(*Config)
		want string // "" accepted
	}{
		{"defaults", func(*Config) {}, ""},
		{"bad setting", func(c *Config) { c.Settings.VerdictWindow = datapath.MaxVerdictWindow + 1 }, "--verdict-window"},
		{"unknown mode", func(c *Config) { c.Settings.Bypass = 9 }, "--bypass"},
		{"services interval too short", func(c *Config) { c.ServicesInterval = time.Millisecond }, "--services-interval"},
		{"two service sources", func(c *Config) { c.KubeServices, c.ServicesFile = true, "s.yaml" }, "give one source of services"},
		{"two pod selectors", func(c *Config) { c.KubePodSelector, c.PodSelector = "app=a", "app=a" }, "give one"},
		{"kube pods without a node", func(c *Config) { c.KubePodSelector = "app=a" }, "--node-name"},
		{"bad pod selector", func(c *Config) { c.PodSelector = "app" }, "--pod-selector"},
		{"pod interval too short", func(c *Config) { c.PodSelector, c.PodInterval = "app=a", time.Millisecond }, "--pod-interval"},
		{"pods", func(c *Config) { c.PodSelector, c.PodInterval = "app=a,tier=web", time.Second }, ""},
		{"two policy sources", func(c *Config) { c.KubePolicies, c.PoliciesFile = true, "p.yaml" }, "give one source of policies"},
		{"kube policies without kube pods", func(c *Config) { c.KubePolicies = true }, "--kube-pod-selector"},
		{"kube policies", func(c *Config) { c.KubePolicies, c.KubePodSelector, c.NodeName = true, "app=a", "n1" }, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.edit(&c)
			err := c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("got %v, want an error naming %q", err, tt.want)
			}
		})
	}
}

// TestTargets: the agent attaches the cgroup v2 root unless it is given
// cgroups or selects pods, and then only the cgroups given.
func TestTargets(t *testing.T) {
	for _, tt := range []struct {
		c    Config
		want []string
	}{
		{Config{}, []string{node.RootTarget}},
		{Config{Cgroups: []string{"a", "b"}}, []string{"a", "b"}},
		{Config{PodSelector: "app=a"}, nil},
		{Config{KubePodSelector: "app=a"}, nil},
		{Config{PodSelector: "app=a", Cgroups: []string{"a"}}, []string{"a"}},
	} {
		if got := tt.c.targets(); !slices.Equal(got, tt.want) {
			t.Errorf("%+v: targets %q, want %q", tt.c, got, tt.want)
		}
	}
}

// TestListenHTTP: /metrics is refused on an address other hosts reach
// unless secured or accepted, a taken port fails the start, and nothing
// to serve serves nothing.
func TestListenHTTP(t *testing.T) {
	if h, err := listenHTTP(WebConfig{}); h != nil || err != nil {
		t.Errorf("nothing to serve: %v, %v", h, err)
	}
	if _, err := listenHTTP(WebConfig{MetricsAddress: "0.0.0.0:0"}); err == nil || !strings.Contains(err.Error(), "--metrics-insecure") {
		t.Errorf("non-loopback without TLS: %v, want a refusal naming the fixes", err)
	}
	bad := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(bad, []byte("tls_server_config: [nope"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := listenHTTP(WebConfig{MetricsAddress: "0.0.0.0:0", WebConfigFile: bad}); err == nil || !strings.Contains(err.Error(), "--web-config-file") {
		t.Errorf("bad web config: %v", err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	if _, err := listenHTTP(WebConfig{MetricsAddress: taken.Addr().String()}); err == nil || !strings.Contains(err.Error(), "choose a free address") {
		t.Errorf("taken port: %v", err)
	}
	h, err := listenHTTP(WebConfig{MetricsAddress: "127.0.0.1:0", HealthAddress: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	h.close()
	for addr, want := range map[string]bool{"127.0.0.1:1": true, "[::1]:1": true, "localhost:1": true, "198.18.0.1:1": false, "nonsense": false} {
		if got := loopback(addr); got != want {
			t.Errorf("loopback(%s) = %v", addr, got)
		}
	}
}

// TestLoadServiceFile: a service file is read and validated whole, and
// its digest changes with its content only.
func TestLoadServiceFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "services.yaml")
	good := "services:\n- name: web\n  vips: [198.19.0.10]\n  ports: [{port: 80, targetPort: 8080}]\n  backends: [{ip: 198.18.0.2}]\n"
	if err := os.WriteFile(path, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	set, sum, err := svcFile(path).load()
	if err != nil || set == nil {
		t.Fatalf("good file: %v", err)
	}
	if _, again, _ := svcFile(path).load(); again != sum {
		t.Error("the same content gave another digest")
	}
	if err := os.WriteFile(path, []byte("services:\n- name: web\n  vips: [not-an-address]\n  ports: [{port: 80}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, other, err := svcFile(path).load(); err == nil || other == sum {
		t.Errorf("bad file: %v (digest changed: %v)", err, other != sum)
	}
	if _, _, err := svcFile(filepath.Join(dir, "missing.yaml")).load(); err == nil || !strings.Contains(err.Error(), "reading service file") {
		t.Errorf("missing file: %v", err)
	}
}

func svcFile(path string) *fileWatch[*service.Set] {
	return &fileWatch[*service.Set]{what: "service", path: path, parse: service.Parse}
}
