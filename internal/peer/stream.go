package peer

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"slices"
)

var (
	errEOF   = errors.New("EOF")
	errIOEOF = io.EOF
)

// Mode says how a connection's receiver and sender behave.
type Mode uint32

const (
	// ModeHalfClose: both sides send, then shutdown(SHUT_WR), read to EOF.
	ModeHalfClose Mode = iota
	// ModeSlowReceiver: the server reads slowly while the client floods.
	ModeSlowReceiver
	// ModeReset: the client sends, then closes with an RST; the server
	// must have received an in-order prefix.
	ModeReset
	// ModePeek: receivers check MSG_PEEK and FIONREAD before each read.
	ModePeek
	// NumModes is how many modes there are; connection i uses mode i % NumModes.
	NumModes
)

var modeNames = [...]string{"half-close", "slow-receiver", "reset", "peek"}

func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", uint32(m))
}

// header opens every stream: it names the payload so the receiver can
// regenerate and verify it.
type header struct {
	Seed   uint64
	Length uint64
	Mode   Mode
	MaxMsg uint32
}

const headerLen = 24

func (h header) marshal() []byte {
	b := make([]byte, headerLen)
	binary.BigEndian.PutUint64(b[0:], h.Seed)
	binary.BigEndian.PutUint64(b[8:], h.Length)
	binary.BigEndian.PutUint32(b[16:], uint32(h.Mode))
	binary.BigEndian.PutUint32(b[20:], h.MaxMsg)
	return b
}

func parseHeader(b []byte) (header, error) {
	if len(b) != headerLen {
		return header{}, fmt.Errorf("header is %d bytes, want %d", len(b), headerLen)
	}
	h := header{
		Seed:   binary.BigEndian.Uint64(b[0:]),
		Length: binary.BigEndian.Uint64(b[8:]),
		Mode:   Mode(binary.BigEndian.Uint32(b[16:])),
		MaxMsg: binary.BigEndian.Uint32(b[20:]),
	}
	if h.Mode >= NumModes {
		return header{}, fmt.Errorf("unknown mode %d", h.Mode)
	}
	if h.MaxMsg == 0 {
		return header{}, errors.New("zero maximum message size")
	}
	return h, nil
}

// payload generates a stream's bytes deterministically from its seed.
type payload struct{ r *rand.ChaCha8 }

func newPayload(seed uint64) *payload {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	binary.LittleEndian.PutUint64(key[8:], ^seed)
	return &payload{r: rand.NewChaCha8(key)}
}

// clone is a generator at the same point of the same stream.
func (p *payload) clone() *payload {
	state, err := p.r.MarshalBinary()
	c := &payload{r: new(rand.ChaCha8)}
	if err == nil {
		err = c.r.UnmarshalBinary(state)
	}
	if err != nil {
		panic("peer: cloning a ChaCha8 generator: " + err.Error()) // its own encoding: cannot fail
	}
	return c
}

// fill writes the next len(b) bytes of the stream into b.
func (p *payload) fill(b []byte) {
	_, _ = p.r.Read(b) // ChaCha8's Read never fails
}

// verifier hashes received bytes and the expected bytes side by side. At
// the first difference it also looks for the bytes received there in the
// expected stream, recentBytes behind and ahead (mismatchFrom): behind,
// they were delivered twice; ahead, bytes were skipped or overtaken.
type verifier struct {
	want     *payload
	got, exp hash.Hash
	n        uint64
	scratch  []byte
	mismatch int64 // first differing offset, -1 if none
	// mismatchFrom is the expected stream's offset of the bytes received
	// at mismatch, -1 if not found (or no mismatch).
	mismatchFrom int64
	// recent holds the last recentBytes expected, at offset n%recentBytes.
	recent []byte
}

// recentBytes is how far behind and ahead a mismatch's bytes are looked
// for: a few coalesced TCP skbs, or a verdict window's sends.
const recentBytes = 256 << 10

// mismatchSample is how many received bytes at a mismatch are looked for.
const mismatchSample = 32

func newVerifier(seed uint64) *verifier {
	return &verifier{want: newPayload(seed), got: sha256.New(), exp: sha256.New(), mismatch: -1, mismatchFrom: -1}
}

func (v *verifier) add(b []byte) {
	if cap(v.scratch) < len(b) {
		v.scratch = make([]byte, len(b))
	}
	w := v.scratch[:len(b)]
	v.want.fill(w)
	if v.mismatch < 0 {
		for i := range b {
			if b[i] != w[i] {
				v.mismatch = int64(v.n) + int64(i)
				v.mismatchFrom = v.locate(b[i:min(i+mismatchSample, len(b))], w, i)
				break
			}
		}
	}
	v.remember(w)
	v.got.Write(b)
	v.exp.Write(w)
	v.n += uint64(len(b))
}

// remember keeps the tail of the expected bytes w (offsets n on).
func (v *verifier) remember(w []byte) {
	if v.recent == nil {
		v.recent = make([]byte, recentBytes)
	}
	off := v.n
	if len(w) > recentBytes {
		off += uint64(len(w) - recentBytes)
		w = w[len(w)-recentBytes:]
	}
	at := int(off % recentBytes)
	n := copy(v.recent[at:], w)
	copy(v.recent, w[n:])
}

// locate finds sample, received at offset m = n+i where the expected
// bytes are w[i:], in the expected stream: among the recentBytes before m
// (the ring, then w[:i]), else among those after m (w[i+1:], then what
// the generator yields after w). It returns the offset, or -1.
func (v *verifier) locate(sample, w []byte, i int) int64 {
	if len(sample) < mismatchSample/4 {
		return -1 // too few bytes to place
	}
	m := int64(v.n) + int64(i)
	kept := int(min(v.n, recentBytes))
	start := int((v.n - uint64(kept)) % recentBytes)
	behind := make([]byte, 0, kept+i)
	if v.recent != nil {
		behind = append(behind, v.recent[start:min(start+kept, recentBytes)]...)
		behind = append(behind, v.recent[:kept-len(behind)]...)
	}
	behind = append(behind, w[:i]...)
	if k := bytes.LastIndex(behind, sample); k >= 0 {
		return m - int64(len(behind)) + int64(k)
	}
	fwd := append(slices.Clone(w[i+1:]), make([]byte, recentBytes)...)
	v.want.clone().fill(fwd[len(w)-i-1:])
	if k := bytes.Index(fwd, sample); k >= 0 {
		return m + 1 + int64(k)
	}
	return -1
}

func (v *verifier) sums() (got, want string) {
	return fmt.Sprintf("%x", v.got.Sum(nil)), fmt.Sprintf("%x", v.exp.Sum(nil))
}
