// Package cri finds pods and containers through the container runtime's
// CRI API (containerd by default): their cgroup v2 directories, network
// namespaces and processes, so that socklane attaches to exactly them.
package cri

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/socklane/socklane/internal/cgroups"
)

// DefaultSocket is containerd's CRI socket.
const DefaultSocket = "/run/containerd/containerd.sock"

// Client talks to a CRI runtime.
type Client struct {
	conn *grpc.ClientConn
	rt   runtimeapi.RuntimeServiceClient
}

// Dial connects to the runtime at socket and checks that it answers.
func Dial(ctx context.Context, socket string) (*Client, error) {
	if _, err := os.Stat(socket); err != nil {
		return nil, fmt.Errorf("no container runtime socket at %s (is containerd running? give its socket with --cri-socket): %w", socket, err)
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connecting to the container runtime at %s: %w", socket, err)
	}
	c := &Client{conn: conn, rt: runtimeapi.NewRuntimeServiceClient(conn)}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.rt.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("the container runtime at %s does not answer the CRI API (v1): %w", socket, err)
	}
	return c, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Runtime is the raw CRI service, for callers that create pods.
func (c *Client) Runtime() runtimeapi.RuntimeServiceClient { return c.rt }

// Container is one container of a pod.
type Container struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	State  string `json:"state"`
	PID    int    `json:"pid,omitempty"`
	Cgroup string `json:"cgroup,omitempty"` // cgroup v2 directory
}

// Pod is one pod sandbox with its containers.
type Pod struct {
	ID         string            `json:"id"`
	Namespace  string            `json:"namespace"`
	Name       string            `json:"name"`
	UID        string            `json:"uid"`
	State      string            `json:"state"`
	IP         string            `json:"ip,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	PID        int               `json:"pid,omitempty"`    // the sandbox's process
	Cgroup     string            `json:"cgroup,omitempty"` // the pod's cgroup v2 directory: its containers' common parent
	Containers []Container       `json:"containers"`
}

// Key is "namespace/name".
func (p Pod) Key() string { return p.Namespace + "/" + p.Name }

// Ready: the sandbox runs.
func (p Pod) Ready() bool { return p.State == "ready" }

// verbosePID reads the process id from a verbose status' info.
func verbosePID(info map[string]string) int {
	var v struct {
		PID int `json:"pid"`
	}
	if raw, ok := info["info"]; ok && json.Unmarshal([]byte(raw), &v) == nil {
		return v.PID
	}
	return 0
}

// Pods lists the runtime's pods with their containers, processes and
// cgroups.
func (c *Client) Pods(ctx context.Context) ([]Pod, error) {
	root, err := cgroups.Root()
	if err != nil {
		return nil, err
	}
	sbs, err := c.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	ctrs, err := c.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return nil, fmt.Errorf("listing containers: %w", err)
	}
	var out []Pod
	for _, sb := range sbs.Items {
		p := Pod{ID: sb.Id, Labels: sb.Labels, State: "notready"}
		if sb.Metadata != nil {
			p.Namespace, p.Name, p.UID = sb.Metadata.Namespace, sb.Metadata.Name, sb.Metadata.Uid
		}
		if sb.State == runtimeapi.PodSandboxState_SANDBOX_READY {
			p.State = "ready"
		}
		st, err := c.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb.Id, Verbose: true})
		if err == nil {
			p.PID = verbosePID(st.Info)
			if st.Status != nil && st.Status.Network != nil {
				p.IP = st.Status.Network.Ip
			}
		}
		var cgs []string
		if p.PID > 0 && p.Ready() {
			if cg, err := cgroups.OfPID(root, p.PID); err == nil {
				cgs = append(cgs, cg)
			}
		}
		for _, ct := range ctrs.Containers {
			if ct.PodSandboxId != sb.Id {
				continue
			}
			k := Container{ID: ct.Id, State: strings.ToLower(strings.TrimPrefix(ct.State.String(), "CONTAINER_"))}
			if ct.Metadata != nil {
				k.Name = ct.Metadata.Name
			}
			if ct.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
				if st, err := c.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: ct.Id, Verbose: true}); err == nil {
					k.PID = verbosePID(st.Info)
				}
				if k.PID > 0 {
					if cg, err := cgroups.OfPID(root, k.PID); err == nil {
						k.Cgroup = cg
						cgs = append(cgs, cg)
					}
				}
			}
			p.Containers = append(p.Containers, k)
		}
		sort.Slice(p.Containers, func(i, j int) bool { return p.Containers[i].Name < p.Containers[j].Name })
		p.Cgroup = commonParent(cgs)
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out, nil
}

// commonParent is the pod's cgroup: the parent directory shared by its
// sandbox's and containers' cgroups ("" if they have none in common
// below the root).
func commonParent(cgs []string) string {
	if len(cgs) == 0 {
		return ""
	}
	parent := filepath.Dir(cgs[0])
	for _, cg := range cgs[1:] {
		for !strings.HasPrefix(cg, parent+"/") && parent != "/" {
			parent = filepath.Dir(parent)
		}
	}
	if parent == "/" || parent == "." {
		return ""
	}
	return parent
}

// Find returns the pod namespace/name ("default" namespace if none).
func Find(pods []Pod, key string) (Pod, error) {
	ns, name, ok := strings.Cut(key, "/")
	if !ok {
		ns, name = "default", key
	}
	var known []string
	for _, p := range pods {
		if p.Namespace == ns && p.Name == name && p.Ready() {
			return p, nil
		}
		known = append(known, p.Key())
	}
	return Pod{}, fmt.Errorf("no running pod %s/%s on this node (pods: %s)", ns, name, strings.Join(known, ", "))
}

// Selector is a set of label requirements key=value (all must hold).
type Selector map[string]string

// ParseSelector reads "k=v,k2=v2".
func ParseSelector(s string) (Selector, error) {
	sel := Selector{}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("selector %q: want key=value[,key=value...]", s)
		}
		sel[k] = v
	}
	return sel, nil
}

// Matches tells whether labels satisfy the selector.
func (s Selector) Matches(labels map[string]string) bool {
	for k, v := range s {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Select returns the running pods the selector matches.
func Select(pods []Pod, sel Selector) []Pod {
	return slices.DeleteFunc(slices.Clone(pods), func(p Pod) bool { return !p.Ready() || !sel.Matches(p.Labels) })
}
