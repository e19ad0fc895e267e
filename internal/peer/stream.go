package peer

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
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

// fill writes the next len(b) bytes of the stream into b.
func (p *payload) fill(b []byte) {
	_, _ = p.r.Read(b) // ChaCha8's Read never fails
}

// verifier hashes received bytes and the expected bytes side by side.
type verifier struct {
	want     *payload
	got, exp hash.Hash
	n        uint64
	scratch  []byte
	mismatch int64 // first differing offset, -1 if none
}

func newVerifier(seed uint64) *verifier {
	return &verifier{want: newPayload(seed), got: sha256.New(), exp: sha256.New(), mismatch: -1}
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
				break
			}
		}
	}
	v.got.Write(b)
	v.exp.Write(w)
	v.n += uint64(len(b))
}

func (v *verifier) sums() (got, want string) {
	return fmt.Sprintf("%x", v.got.Sum(nil)), fmt.Sprintf("%x", v.exp.Sum(nil))
}
