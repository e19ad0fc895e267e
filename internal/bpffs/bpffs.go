// Package bpffs checks for and mounts the BPF filesystem that holds
// socklane's pinned objects.
package bpffs

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// DefaultPath is where bpffs is normally mounted.
const DefaultPath = "/sys/fs/bpf"

// IsMounted reports whether path is on a bpf filesystem.
func IsMounted(path string) bool {
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return false
	}
	return fs.Type == unix.BPF_FS_MAGIC
}

// Require returns an error naming the fix when path is not a bpffs.
func Require(path string) error {
	if IsMounted(path) {
		return nil
	}
	return fmt.Errorf("no bpf filesystem at %s: start `socklane agent` (it mounts one) or run `mount -t bpf bpf %s`", path, path)
}

// Ensure mounts a bpffs at path unless one is there already.
func Ensure(path string) error {
	if IsMounted(path) {
		return nil
	}
	if err := os.MkdirAll(path, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	if err := unix.Mount("bpf", path, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mounting bpffs at %s: %w", path, err)
	}
	return nil
}
