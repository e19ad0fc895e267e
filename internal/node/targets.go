package node

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/socklane/socklane/internal/cgroups"
	"github.com/socklane/socklane/internal/cri"
)

// Selection names cgroups the way a command line does: exactly one of a
// cgroup path, a process in it, a pod (and one of its containers) or a
// label selector over the running pods, the pods found through the
// container runtime at CRISocket.
type Selection struct {
	Cgroup    string
	PID       int
	Pod       string
	Container string
	Selector  string
	CRISocket string
}

// Targets resolves the selection to checked cgroups.
func (s Selection) Targets(ctx context.Context) ([]Target, error) {
	n := 0
	for _, set := range []bool{s.Cgroup != "", s.PID != 0, s.Pod != "", s.Selector != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		return nil, errors.New("give exactly one of --cgroup PATH, --pid PID, --pod NAMESPACE/NAME or --selector KEY=VALUE")
	}
	if s.Container != "" && s.Pod == "" {
		return nil, errors.New("--container needs --pod")
	}
	root, err := cgroups.Root()
	if err != nil {
		return nil, err
	}
	var paths []string
	switch {
	case s.Cgroup != "":
		paths = []string{s.Cgroup}
	case s.PID != 0:
		if s.PID < 0 {
			return nil, fmt.Errorf("invalid --pid %d", s.PID)
		}
		path, err := cgroups.OfPID(root, s.PID)
		if err != nil {
			return nil, err
		}
		paths = []string{path}
	default:
		if paths, err = s.podCgroups(ctx); err != nil {
			return nil, err
		}
	}
	return ResolveTargets(paths)
}

// podCgroups resolves Pod/Container or Selector through the CRI.
func (s Selection) podCgroups(ctx context.Context) ([]string, error) {
	var sel cri.Selector
	if s.Selector != "" {
		var err error
		if sel, err = cri.ParseSelector(s.Selector); err != nil {
			return nil, err
		}
	}
	socket := s.CRISocket
	if socket == "" {
		socket = cri.DefaultSocket
	}
	c, err := cri.Dial(ctx, socket)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	pods, err := c.Pods(ctx)
	if err != nil {
		return nil, err
	}
	if sel != nil {
		var paths []string
		for _, p := range cri.Select(pods, sel) {
			if p.Cgroup != "" {
				paths = append(paths, p.Cgroup)
			}
		}
		if len(paths) == 0 {
			return nil, fmt.Errorf("no running pod matches %s", s.Selector)
		}
		return paths, nil
	}
	p, err := cri.Find(pods, s.Pod)
	if err != nil {
		return nil, err
	}
	if s.Container == "" {
		if p.Cgroup == "" {
			return nil, fmt.Errorf("pod %s has no cgroup yet (no running container)", p.Key())
		}
		return []string{p.Cgroup}, nil
	}
	var names []string
	for _, k := range p.Containers {
		if k.Name == s.Container {
			if k.Cgroup == "" {
				return nil, fmt.Errorf("container %s of pod %s is not running", k.Name, p.Key())
			}
			return []string{k.Cgroup}, nil
		}
		names = append(names, k.Name)
	}
	return nil, fmt.Errorf("pod %s has no container %s (it has: %s)", p.Key(), s.Container, strings.Join(names, ", "))
}
