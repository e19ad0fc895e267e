// Package procsock finds the listening TCP sockets that the processes of a
// cgroup hold, through /proc: what socklane learns of servers that were
// listening before it was attached to their cgroup.
package procsock

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Listener is one listening socket a process of the cgroup holds.
type Listener struct {
	Inode     uint64
	Port      uint16
	Pid       int
	Cgroup    string // the cgroup directory of the process
	NetnsPath string // /proc/PID/ns/net
	Blocking  bool   // the listening socket's file is blocking
	// Caught are the signals the process handles (SigCgt of
	// /proc/PID/status: bit signal - 1); all when it cannot be read.
	Caught uint64
}

// oNonblock is O_NONBLOCK as /proc/PID/fdinfo prints it (octal flags).
const oNonblock = 0o4000

// tcpListen is TCP_LISTEN in /proc/net/tcp's st column.
const tcpListen = "0A"

// InCgroup lists the listening TCP sockets held by the processes of the
// cgroup at dir and its descendants. Processes that exit meanwhile are
// skipped.
func InCgroup(dir string) ([]Listener, error) {
	var out []Listener
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		pids, err := readPids(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			return nil // a cgroup removed meanwhile
		}
		for _, pid := range pids {
			ls, err := OfPid(pid)
			if err != nil {
				continue // exited meanwhile
			}
			for i := range ls {
				ls[i].Cgroup = path
			}
			out = append(out, ls...)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("walking cgroup %s: %w", dir, err)
	}
	return out, nil
}

func readPids(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

// OfPid lists the listening TCP sockets a process holds.
func OfPid(pid int) ([]Listener, error) {
	proc := fmt.Sprintf("/proc/%d", pid)
	fds, err := os.ReadDir(filepath.Join(proc, "fd"))
	if err != nil {
		return nil, err
	}
	byInode := map[uint64]string{} // socket inode -> fd
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(proc, "fd", fd.Name()))
		if err != nil {
			continue
		}
		if ino, ok := socketInode(link); ok {
			byInode[ino] = fd.Name()
		}
	}
	if len(byInode) == 0 {
		return nil, nil
	}
	var out []Listener
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(filepath.Join(proc, "net", table))
		if err != nil {
			continue
		}
		ls, err := ParseListening(f)
		f.Close()
		if err != nil {
			return nil, err
		}
		for _, l := range ls {
			fd, ok := byInode[l.Inode]
			if !ok {
				continue
			}
			flags, err := fdFlags(filepath.Join(proc, "fdinfo", fd))
			if err != nil {
				continue
			}
			l.Pid, l.NetnsPath, l.Blocking = pid, filepath.Join(proc, "ns", "net"), flags&oNonblock == 0
			l.Caught = caughtSignals(filepath.Join(proc, "status"))
			out = append(out, l)
		}
	}
	return out, nil
}

// caughtSignals reads SigCgt of a /proc/PID/status: the signals the
// process handles (every one when it cannot be read).
func caughtSignals(status string) uint64 {
	f, err := os.Open(status)
	if err != nil {
		return ^uint64(0)
	}
	defer f.Close()
	if v, ok := ParseSigCgt(f); ok {
		return v
	}
	return ^uint64(0)
}

// ParseSigCgt finds the SigCgt line of a /proc/PID/status.
func ParseSigCgt(r io.Reader) (uint64, bool) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "SigCgt:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// socketInode parses "socket:[12345]".
func socketInode(link string) (uint64, bool) {
	s, ok := strings.CutPrefix(link, "socket:[")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, "]")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil
}

// ParseListening reads /proc/net/tcp or tcp6 and returns the listening
// sockets (port and inode).
func ParseListening(r io.Reader) ([]Listener, error) {
	sc := bufio.NewScanner(r)
	var out []Listener
	first := true
	for sc.Scan() {
		if first { // the header
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		if len(f) < 10 || f[3] != tcpListen {
			continue
		}
		_, portHex, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		port, err := strconv.ParseUint(portHex, 16, 16)
		if err != nil {
			continue
		}
		ino, err := strconv.ParseUint(f[9], 10, 64)
		if err != nil || ino == 0 {
			continue
		}
		out = append(out, Listener{Inode: ino, Port: uint16(port)})
	}
	return out, sc.Err()
}

// fdFlags reads the flags line of /proc/PID/fdinfo/FD (octal).
func fdFlags(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "flags:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 8, 64)
		}
	}
	return 0, fmt.Errorf("%s: no flags line", path)
}
