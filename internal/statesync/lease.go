package statesync

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// DefaultLeaseDuration is how long a lease holds without renewal.
const DefaultLeaseDuration = 15 * time.Second

// Lease names the Kubernetes Lease the nodes of an active-standby pair
// elect their active one with.
type Lease struct {
	Namespace, Name string
	// Duration: a node that stops renewing loses the lease this long
	// after its last renewal (it renews every Duration/3 and gives up
	// after 2/3 of it without success).
	Duration time.Duration
}

// ParseLease reads NAMESPACE/NAME.
func ParseLease(s string, d time.Duration) (Lease, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" {
		return Lease{}, fmt.Errorf("--sync-lease %q: want NAMESPACE/NAME of the Lease the active-standby nodes share", s)
	}
	if d < 2*time.Second {
		return Lease{}, fmt.Errorf("--sync-lease-duration %s: want at least 2s", d)
	}
	return Lease{Namespace: ns, Name: name, Duration: d}, nil
}

// RunLease contends for the lease until ctx ends: this node becomes the
// leader when it wins (active once caught up, see SetLeader) and a
// standby when it loses it, then contends again.
func (e *Engine) RunLease(ctx context.Context, client kubernetes.Interface, l Lease) error {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: l.Namespace, Name: l.Name},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.cfg.Node},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   l.Duration,
		RenewDeadline:   l.Duration * 2 / 3,
		RetryPeriod:     l.Duration / 6,
		ReleaseOnCancel: true,
		Name:            "socklane-sync",
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { e.SetLeader(true) },
			OnStoppedLeading: func() { e.SetLeader(false) },
			OnNewLeader: func(id string) {
				e.log.Info("sync: lease holder", "lease", l.Namespace+"/"+l.Name, "holder", id)
				if id != e.cfg.Node {
					e.mu.Lock()
					e.lastActive = id
					e.mu.Unlock()
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("--sync-lease %s/%s: %w", l.Namespace, l.Name, err)
	}
	for ctx.Err() == nil {
		le.Run(ctx)
	}
	return nil
}
