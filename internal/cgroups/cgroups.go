// Package cgroups finds the cgroup v2 hierarchy and resolves cgroup paths
// and process cgroups within it.
package cgroups

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNoCgroup2 means no cgroup v2 hierarchy is mounted.
var ErrNoCgroup2 = errors.New("no cgroup v2 filesystem is mounted (socklane needs cgroup v2: mount it with `mount -t cgroup2 none /sys/fs/cgroup/unified` or boot with systemd.unified_cgroup_hierarchy=1)")

// Root returns the mount point of the cgroup v2 hierarchy, read from
// /proc/self/mountinfo (pure v2 at /sys/fs/cgroup, hybrid at
// /sys/fs/cgroup/unified, or anywhere else).
func Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("reading mounts: %w", err)
	}
	defer f.Close()
	return rootFrom(f)
}

func rootFrom(r io.Reader) (string, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superopts
		line := sc.Text()
		sep := strings.Index(line, " - ")
		if sep < 0 {
			continue
		}
		post := strings.Fields(line[sep+3:])
		pre := strings.Fields(line[:sep])
		if len(post) < 1 || len(pre) < 5 || post[0] != "cgroup2" {
			continue
		}
		if pre[3] != "/" {
			continue // a bind mount of a sub-tree, not the hierarchy root
		}
		return unescape(pre[4]), nil
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("reading mounts: %w", err)
	}
	return "", ErrNoCgroup2
}

// unescape undoes mountinfo's octal escapes (\040 for space and so on).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + byte(c-'0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Resolve checks that path is a directory of the cgroup v2 hierarchy rooted
// at root and returns its cleaned absolute path and cgroup id. A relative path
// is taken relative to root.
func Resolve(root, path string) (string, uint64, error) {
	if !filepath.IsAbs(path) {
		path = filepath.Join(root, path)
	}
	path = filepath.Clean(path)
	rel, err := filepath.Rel(root, path)
	if err != nil || strings.HasPrefix(rel, "..") {
		return "", 0, fmt.Errorf("%s is not inside the cgroup v2 hierarchy at %s", path, root)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", 0, fmt.Errorf("cgroup %s: %w (give an existing cgroup v2 directory under %s)", path, err, root)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return "", 0, fmt.Errorf("cgroup %s is not a directory", path)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return "", 0, fmt.Errorf("cgroup %s: %w", path, err)
	}
	if fs.Type != unix.CGROUP2_SUPER_MAGIC {
		return "", 0, fmt.Errorf("%s is not on a cgroup v2 filesystem", path)
	}
	return path, st.Ino, nil
}

// OfPID returns the cgroup v2 directory of a process.
func OfPID(root string, pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("process %d does not exist", pid)
	}
	if err != nil {
		return "", fmt.Errorf("reading cgroup of process %d: %w", pid, err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		// "0::/path" is the v2 entry.
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			return filepath.Join(root, rest), nil
		}
	}
	return "", fmt.Errorf("process %d has no cgroup v2 membership", pid)
}

// ID returns the cgroup id (inode number) of a cgroup directory.
func ID(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Ino, nil
}

// fileIDKernfs is the file handle type of a kernfs (cgroup) node, whose
// handle is its 64-bit id.
const fileIDKernfs = 0xfe

// ErrGone means no cgroup has the id any more.
var ErrGone = errors.New("cgroup gone")

// PathOf finds the directory of the cgroup with id under root (through
// open_by_handle_at, as the kernel names cgroups by id). It returns ErrGone
// when the cgroup was removed.
func PathOf(root string, id uint64) (string, error) {
	mnt, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("opening %s: %w", root, err)
	}
	defer unix.Close(mnt)
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], id)
	fd, err := unix.OpenByHandleAt(mnt, unix.NewFileHandle(fileIDKernfs, b[:]), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if errors.Is(err, unix.ESTALE) || errors.Is(err, unix.ENOENT) {
		return "", ErrGone
	}
	if err != nil {
		return "", fmt.Errorf("finding cgroup %d: %w", id, err)
	}
	defer unix.Close(fd)
	path, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return "", fmt.Errorf("naming cgroup %d: %w", id, err)
	}
	return path, nil
}
