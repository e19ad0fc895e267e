package kerneltest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/socklane/socklane/internal/datapath"
	"github.com/socklane/socklane/internal/sockbugs"
	"github.com/socklane/socklane/internal/testutil"
	"golang.org/x/sys/unix"
)

// What a rebuilt sender resends of what its receiver has (overlapHead:
// more than one step of sl_skb's cut, SL_SKB_TRIM_STEP) and what it sends
// new (overlapTail), after a first overlapFirst bytes; all of it within one
// segment of loopback's MSS.
const (
	overlapFirst = 10000
	overlapHead  = 5000
	overlapTail  = 200
	tcpSendQueue = 2 // TCP_REPAIR_QUEUE's queues (linux/tcp.h)
	tcpRecvQueue = 1
)

// overlapResult is what one overlapping retransmission delivered.
type overlapResult struct {
	got, want int
	exact     bool // the stream, every byte once
	repeated  bool // the stream with the resent head delivered twice
	retrans   uint32
}

func (r overlapResult) String() string {
	return fmt.Sprintf("overlap got=%d want=%d exact=%v repeated=%v retrans=%d", r.got, r.want, r.exact, r.repeated, r.retrans)
}

var overlapLine = regexp.MustCompile(`overlap got=(\d+) want=(\d+) exact=(true|false) repeated=(true|false) retrans=(\d+)`)

func parseOverlap(out string) (overlapResult, error) {
	m := overlapLine.FindStringSubmatch(out)
	if m == nil {
		return overlapResult{}, fmt.Errorf("no result in %q", out)
	}
	got, _ := strconv.Atoi(m[1])
	want, _ := strconv.Atoi(m[2])
	retrans, _ := strconv.Atoi(m[5])
	return overlapResult{got: got, want: want, exact: m[3] == "true", repeated: m[4] == "true", retrans: uint32(retrans)}, nil
}

// inPrivateNetns runs fn in a network namespace of its own
// (sockbugs.InPrivateNetns) whose TCP negotiates neither timestamps nor
// window scaling (a sender rebuilt by TCP_REPAIR then needs neither).
// /proc/sys/net is the opening thread's namespace's.
func inPrivateNetns(fn func() (overlapResult, error)) (overlapResult, error) {
	var r overlapResult
	err := sockbugs.InPrivateNetns(func() error {
		for _, f := range []string{"tcp_timestamps", "tcp_window_scaling"} {
			if err := os.WriteFile("/proc/sys/net/ipv4/"+f, []byte("0"), 0); err != nil {
				return fmt.Errorf("turning %s off in the test's namespace: %w", f, err)
			}
		}
		var err error
		r, err = fn()
		return err
	})
	return r, err
}

// repairWindow is struct tcp_repair_window (linux/tcp.h).
type repairWindow struct {
	SndWl1, SndWnd, MaxWindow, RcvWnd, RcvWup uint32
}

// rebuild silently closes an established sender (in repair mode a close
// sends neither FIN nor RST) and makes a new one on its 4-tuple whose send
// sequence is back bytes behind the old one's: in repair mode again, so
// that what is written next is queued as sent, not sent, and goes out on
// the retransmission timer once repair is off.
func rebuild(old int, back uint32, peer unix.Sockaddr) (int, error) {
	if err := unix.SetsockoptInt(old, unix.IPPROTO_TCP, unix.TCP_REPAIR, unix.TCP_REPAIR_ON); err != nil {
		return -1, fmt.Errorf("TCP_REPAIR (needs CAP_NET_ADMIN): %w", err)
	}
	seq := func(q int) (int, error) {
		if err := unix.SetsockoptInt(old, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, q); err != nil {
			return 0, err
		}
		return unix.GetsockoptInt(old, unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ)
	}
	snd, err := seq(tcpSendQueue)
	if err != nil {
		return -1, fmt.Errorf("reading the send sequence: %w", err)
	}
	rcv, err := seq(tcpRecvQueue)
	if err != nil {
		return -1, fmt.Errorf("reading the receive sequence: %w", err)
	}
	mss, err := unix.GetsockoptInt(old, unix.IPPROTO_TCP, unix.TCP_MAXSEG)
	if err != nil {
		return -1, err
	}
	local, err := unix.Getsockname(old)
	if err != nil {
		return -1, err
	}
	// The windows, or the new sender's is 0 until an ACK it may take
	// for an old one (snd_wl1).
	var win repairWindow
	size := uint32(unsafe.Sizeof(win))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(old), unix.IPPROTO_TCP, unix.TCP_REPAIR_WINDOW,
		uintptr(unsafe.Pointer(&win)), uintptr(unsafe.Pointer(&size)), 0); e != 0 {
		return -1, fmt.Errorf("reading TCP_REPAIR_WINDOW: %w", e)
	}
	unix.Close(old)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	ok := false
	defer func() {
		if !ok {
			unix.Close(fd)
		}
	}()
	for _, o := range [][3]int{{unix.IPPROTO_TCP, unix.TCP_REPAIR, unix.TCP_REPAIR_ON}, {unix.SOL_SOCKET, unix.SO_REUSEADDR, 1}} {
		if err := unix.SetsockoptInt(fd, o[0], o[1], o[2]); err != nil {
			return -1, err
		}
	}
	if err := unix.Bind(fd, local); err != nil {
		return -1, fmt.Errorf("binding the rebuilt sender: %w", err)
	}
	for _, q := range [][2]int{{tcpSendQueue, int(uint32(snd) - back)}, {tcpRecvQueue, rcv}} {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, q[0]); err != nil {
			return -1, err
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ, q[1]); err != nil {
			return -1, err
		}
	}
	// The segment size too (TCP_REPAIR_OPTIONS' MSS clamps, but the size
	// taken at connect stays TCP's default 536), at most what TCP_MAXSEG
	// takes (32,767; loopback's is about 65,000).
	mss = min(mss, 32767)
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_MAXSEG, mss); err != nil {
		return -1, fmt.Errorf("TCP_MAXSEG %d: %w", mss, err)
	}
	if err := unix.Connect(fd, peer); err != nil {
		return -1, fmt.Errorf("connecting the rebuilt sender (repair): %w", err)
	}
	opts := []unix.TCPRepairOpt{{Code: unix.TCPOPT_MAXSEG, Val: uint32(mss)}}
	if _, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR_OPTIONS,
		uintptr(unsafe.Pointer(&opts[0])), uintptr(len(opts))*unsafe.Sizeof(opts[0]), 0); e != 0 {
		return -1, fmt.Errorf("TCP_REPAIR_OPTIONS: %w", e)
	}
	if _, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR_WINDOW,
		uintptr(unsafe.Pointer(&win)), unsafe.Sizeof(win), 0); e != 0 {
		return -1, fmt.Errorf("setting TCP_REPAIR_WINDOW: %w", e)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, tcpSendQueue); err != nil {
		return -1, err
	}
	ok = true
	return fd, nil
}

// repairOff leaves repair mode without the window probe, which would have
// the receiver acknowledge what it has and the sender trim its resent
// head before resending it.
func repairOff(fd int) error {
	return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, unix.TCP_REPAIR_OFF_NO_WP)
}

// acked waits until fd's peer has acknowledged everything sent, so that
// the peer owes it nothing (a delayed ACK to a 4-tuple without a socket
// would be answered by a reset).
func acked(fd int) error {
	for i := 0; i < 400; i++ {
		info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return err
		}
		if info.Unacked == 0 {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return errors.New("the receiver did not acknowledge the first bytes in 2 s")
}

// overlapStream connects a sender to a receiver on loopback (join, if
// given, acts on the receiver first), rebuilds the sender without a
// handshake so that it is a plain TCP socket whatever the datapath does
// with the first one, sends overlapFirst bytes through TCP, then rebuilds it
// overlapHead bytes back and writes those bytes again with overlapTail new
// ones: its retransmission starts before the receiver's rcv_nxt, which TCP
// queues whole (a "partial packet"). It reads what the receiver gets.
func overlapStream(join func(server int) error) (overlapResult, error) {
	var r overlapResult
	// The receiver reads in non-blocking mode, so that the datapath
	// bypasses it whatever signals the process handles.
	ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return r, err
	}
	defer unix.Close(ln)
	addr := &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: 7720}
	if err := unix.Bind(ln, addr); err != nil {
		return r, err
	}
	if err := unix.Listen(ln, 1); err != nil {
		return r, err
	}
	c, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return r, err
	}
	if err := unix.Connect(c, addr); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		unix.Close(c)
		return r, err
	}
	s, err := acceptWithin(ln, 2*time.Second)
	if err != nil {
		unix.Close(c)
		return r, err
	}
	defer unix.Close(s)
	if join != nil {
		if err := join(s); err != nil {
			unix.Close(c)
			return r, err
		}
	}
	if c, err = rebuild(c, 0, addr); err != nil {
		return r, err
	}
	first := make([]byte, overlapFirst)
	for i := range first {
		first[i] = byte('a' + i%26)
	}
	if err := repairOff(c); err != nil {
		unix.Close(c)
		return r, err
	}
	if n, err := unix.Write(c, first); err != nil || n != len(first) {
		unix.Close(c)
		return r, fmt.Errorf("sending the first bytes: %d, %v", n, err)
	}
	got := make([]byte, 0, 2*overlapFirst)
	buf := make([]byte, 4096)
	for len(got) < len(first) {
		n, err := readWithin(s, buf, 5*time.Second)
		if err != nil || n == 0 {
			unix.Close(c)
			return r, fmt.Errorf("reading the first bytes (%d of %d): %d, %v", len(got), len(first), n, err)
		}
		got = append(got, buf[:n]...)
	}
	if err := acked(c); err != nil {
		unix.Close(c)
		return r, err
	}
	if c, err = rebuild(c, overlapHead, addr); err != nil {
		return r, err
	}
	defer unix.Close(c)
	second := append(append([]byte{}, first[len(first)-overlapHead:]...), bytes.Repeat([]byte{'Z'}, overlapTail)...)
	if n, err := unix.Write(c, second); err != nil || n != len(second) {
		return r, fmt.Errorf("queueing the resent bytes: %d, %v", n, err)
	}
	if err := repairOff(c); err != nil {
		return r, err
	}
	want := append(append([]byte{}, first...), second[overlapHead:]...)
	// The retransmission timer (1 s for a sender without an RTT sample),
	// then whatever else arrives within 300 ms.
	for wait := 5 * time.Second; len(got) < len(want)+overlapHead; {
		n, err := readWithin(s, buf, wait)
		if err != nil || n == 0 {
			break
		}
		got = append(got, buf[:n]...)
		if len(got) >= len(want) {
			wait = 300 * time.Millisecond
		}
	}
	if info, err := unix.GetsockoptTCPInfo(c, unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
		r.retrans = info.Total_retrans
	}
	r.got, r.want = len(got), len(want)
	r.exact = bytes.Equal(got, want)
	r.repeated = bytes.Equal(got, append(append([]byte{}, first...), second...))
	return r, nil
}

// readWithin reads what non-blocking fd has, waiting up to d for it: 0
// bytes and no error at end of file, an error if nothing came.
func readWithin(fd int, buf []byte, d time.Duration) (int, error) {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for deadline := time.Now().Add(d); ; {
		n, err := unix.Read(fd, buf)
		if !errors.Is(err, unix.EAGAIN) {
			return n, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return 0, fmt.Errorf("nothing to read in %v", d)
		}
		if _, err := unix.Poll(fds, int(left/time.Millisecond)+1); err != nil && !errors.Is(err, unix.EINTR) {
			return 0, err
		}
	}
}

// acceptWithin accepts a connection on non-blocking ln, within d; the
// socket is non-blocking too.
func acceptWithin(ln int, d time.Duration) (int, error) {
	fds := []unix.PollFd{{Fd: int32(ln), Events: unix.POLLIN}}
	for deadline := time.Now().Add(d); ; {
		s, _, err := unix.Accept4(ln, unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
		if !errors.Is(err, unix.EAGAIN) {
			return s, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return -1, fmt.Errorf("no connection in %v", d)
		}
		if _, err := unix.Poll(fds, int(left/time.Millisecond)+1); err != nil && !errors.Is(err, unix.EINTR) {
			return -1, err
		}
	}
}

// bareVerdict puts a socket in a socket map of its own with an sk_skb
// stream verdict that passes every segment to it, nothing else: how the
// kernel alone delivers TCP's bytes through such a verdict.
func bareVerdict(release *[]func()) func(int) error {
	return func(s int) error {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.SockHash, KeySize: 4, ValueSize: 8, MaxEntries: 1})
		if err != nil {
			return err
		}
		*release = append(*release, func() { m.Close() })
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SkSKB, License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}}) // SK_PASS
		if err != nil {
			return err
		}
		*release = append(*release, func() { prog.Close() })
		if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: m.FD(), Program: prog, Attach: ebpf.AttachSkSKBStreamVerdict}); err != nil {
			return err
		}
		return m.Update(uint32(0), uint64(s), ebpf.UpdateAny)
	}
}

// TestRetransmitOverlap: a TCP retransmission that starts before what its
// receiver has (its head repeats bytes already delivered) reaches a socket
// of the bypass every byte once. TCP queues such a segment whole and
// tcp_recvmsg skips its head by offset; an sk_skb stream verdict (the
// valve's, sl_skb) is handed the whole segment, and passed as it is the
// head would be read twice (the bare verdict row: the kernel's own
// behaviour, the test's control). With the valve the datapath cuts the
// head off and counts it (skb_overlaps, skb_overlap_bytes); without it
// TCP's bytes never reach a verdict. Plain TCP is the reference.
func TestRetransmitOverlap(t *testing.T) {
	testutil.RequireRoot(t)
	var release []func()
	defer func() {
		for _, f := range release {
			f()
		}
	}()
	plain, err := inPrivateNetns(func() (overlapResult, error) { return overlapStream(nil) })
	if err != nil {
		t.Fatalf("plain TCP: %v", err)
	}
	bare, err := inPrivateNetns(func() (overlapResult, error) { return overlapStream(bareVerdict(&release)) })
	if err != nil {
		t.Fatalf("a bare stream verdict: %v", err)
	}
	t.Logf("plain TCP: %s", plain)
	t.Logf("a bare stream verdict: %s", bare)
	if !plain.exact || plain.retrans == 0 {
		t.Fatalf("plain TCP: %s; want the stream exact after a retransmission", plain)
	}
	if !bare.exact && !bare.repeated {
		t.Fatalf("a bare stream verdict: %s; want the stream exact, or with the resent head twice", bare)
	}
	for _, late := range []datapath.Mode{datapath.ModeOff, datapath.ModeOn} {
		t.Run(map[datapath.Mode]string{datapath.ModeOff: "verdict at join", datapath.ModeOn: "verdict given late"}[late], func(t *testing.T) {
			overlapSocklane(t, late, bare)
		})
	}
}

// overlapSocklane runs the overlap stream to a bypassed receiver. Given
// the verdict as it joins (the valve), sl_skb must cut the repeated head;
// given it late, a receiver that never fell behind has none, and TCP's
// own receive path skips the head.
func overlapSocklane(t *testing.T, late datapath.Mode, bare overlapResult) {
	n := newNode(t, func(s *datapath.Settings) { s.LateVerdict = late })
	settings, err := n.dp.Settings()
	if err != nil {
		t.Fatal(err)
	}
	valve := settings.BacklogValve.On() && !settings.LateVerdict.On()
	before := n.counters()
	cmd, out := n.run("overlap")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the overlap role: %v: %s", err, out.String())
	}
	got, err := parseOverlap(out.String())
	if err != nil {
		t.Fatal(err)
	}
	d := delta(before, n.counters())
	t.Logf("socklane (verdict from the start %v): %s; skb_overlaps %d, skb_overlap_bytes %d, err_skb_trim %d, fallback_no_handshake %d",
		valve, got, d["skb_overlaps"], d["skb_overlap_bytes"], d["err_skb_trim"], d["fallback_no_handshake"])
	if !got.exact {
		t.Errorf("socklane: %s; want every byte once (counters %v)", got, d)
	}
	if d["err_skb_trim"] != 0 {
		t.Errorf("overlaps not cut: %d", d["err_skb_trim"])
	}
	// The sender was rebuilt without a handshake: on TCP, and so its
	// bytes reach the bypassed receiver through TCP.
	if d["fallback_no_handshake"] < 1 {
		t.Errorf("fallback_no_handshake %d: the rebuilt sender was not seen", d["fallback_no_handshake"])
	}
	if valve && bare.repeated && (d["skb_overlaps"] < 1 || d["skb_overlap_bytes"] != overlapHead) {
		t.Errorf("with the valve: skb_overlaps %d, skb_overlap_bytes %d; want the %d repeated bytes cut once", d["skb_overlaps"], d["skb_overlap_bytes"], overlapHead)
	}
	if !valve && d["skb_overlaps"] != 0 {
		t.Errorf("without the verdict sl_skb cut %d segments", d["skb_overlaps"])
	}
}
