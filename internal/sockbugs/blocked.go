package sockbugs

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// waitBlocked waits until thread tid of this process sleeps interruptibly
// in a system call on fd (its state in /proc/self/task/TID/stat, the call
// and its first argument in .../syscall), for at most limit, polling each
// millisecond; it reports whether it saw that. Where /proc does not show
// it, it waits limit out, the fixed pause the probes took before.
func waitBlocked(tid, fd int, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for {
		ok, err := blockedOn(tid, fd)
		if err != nil {
			time.Sleep(time.Until(deadline))
			return false
		}
		if ok {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

// blockedOn reports whether thread tid sleeps interruptibly in a system
// call whose first argument is fd. An error: /proc does not tell.
func blockedOn(tid, fd int) (bool, error) {
	dir := "/proc/self/task/" + strconv.Itoa(tid) + "/"
	stat, err := os.ReadFile(dir + "stat")
	if err != nil {
		return false, err
	}
	// The state follows the command name, which may hold anything.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return false, fmt.Errorf("reading %sstat: no state in %q", dir, stat)
	}
	if stat[i+2] != 'S' {
		return false, nil
	}
	sc, err := os.ReadFile(dir + "syscall")
	if err != nil {
		return false, err
	}
	// "NR ARG0 ARG1 ... SP PC" while blocked in a call, "-1 SP PC" while
	// blocked outside one, "running" while it runs.
	f := strings.Fields(string(sc))
	if len(f) < 2 || f[0] == "running" || f[0] == "-1" {
		return false, nil
	}
	arg, err := strconv.ParseUint(strings.TrimPrefix(f[1], "0x"), 16, 64)
	return err == nil && arg == uint64(fd), nil
}
