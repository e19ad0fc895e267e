package cgroups

import (
	"errors"
	"strings"
	"testing"
)

func TestRootFrom(t *testing.T) {
	tests := []struct {
		name, mountinfo, want string
		err                   error
	}{
		{
			name: "hybrid",
			mountinfo: `25 1 0:23 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw
26 25 0:24 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
27 25 0:25 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu`,
			want: "/sys/fs/cgroup/unified",
		},
		{
			name:      "pure v2",
			mountinfo: `30 1 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate`,
			want:      "/sys/fs/cgroup",
		},
		{
			name: "bind mounted subtree skipped",
			mountinfo: `40 1 0:26 /kubepods /host/cg rw - cgroup2 cgroup2 rw
41 1 0:26 / /mnt/cg\040two rw - cgroup2 cgroup2 rw`,
			want: "/mnt/cg two",
		},
		{
			name:      "v1 only",
			mountinfo: `27 25 0:25 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu`,
			err:       ErrNoCgroup2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := rootFrom(strings.NewReader(tt.mountinfo))
			if !errors.Is(err, tt.err) {
				t.Fatalf("err = %v, want %v", err, tt.err)
			}
			if got != tt.want {
				t.Fatalf("root = %q, want %q", got, tt.want)
			}
		})
	}
}

func FuzzRootFrom(f *testing.F) {
	f.Add("26 25 0:24 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw")
	f.Add(`1 2 3 / /a\040b - cgroup2 x`)
	f.Fuzz(func(t *testing.T, s string) {
		root, err := rootFrom(strings.NewReader(s))
		if err == nil && root == "" {
			t.Fatal("empty root without error")
		}
	})
}
