package testutil

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// AttachedCount is how many programs the kernel runs at the cgroup's hook
// at (its own list, whoever attached them).
func AttachedCount(t *testing.T, cgroup string, at ebpf.AttachType) int {
	t.Helper()
	fd, err := unix.Open(cgroup, unix.O_DIRECTORY|unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: at})
	if err != nil {
		t.Fatalf("querying %s on %s: %v", at, cgroup, err)
	}
	return len(res.Programs)
}
