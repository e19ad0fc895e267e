package statesync

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
)

// recordHeader is the size of struct sl_sync_record.
var recordHeader = binary.Size(churnSlSyncRecord{})

// recordKeys appends to keys the keys of table's records in raw (a
// sample of the ring buffer or a CPU's stage: records back to back, each
// padded to 8 bytes); a record of another size is not table's.
func recordKeys(raw []byte, table uint32, keySize int, keys [][]byte) [][]byte {
	for off := 0; off+recordHeader <= len(raw); {
		var h churnSlSyncRecord
		if _, err := binary.Decode(raw[off:off+recordHeader], binary.NativeEndian, &h); err != nil {
			break
		}
		n := int(h.KeyLen)
		if n > lookupMaxKey || off+recordHeader+n > len(raw) {
			break
		}
		if h.Table == table && n == keySize {
			keys = append(keys, bytes.Clone(raw[off+recordHeader:off+recordHeader+n]))
		}
		off += (recordHeader + n + 7) &^ 7
	}
	return keys
}

// stageReader reads the records the writers' CPUs hold in their stages
// (sl_sync_stages), handing out a CPU's records only when its stage
// moved since the last read (another append, or other bytes: a record
// read while it was being written is read again once written); a stage
// left as it was is not read twice.
type stageReader struct {
	m       *ebpf.Map
	vals    []churnSlSyncStage
	last    [][]byte
	appends []uint64
}

// openStages opens the stages pinned at path. Without them the records
// a writer stages would go unseen until a stage fills: a missing pin is
// an error (the caller reads the map instead).
func openStages(path string) (*stageReader, error) {
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no staged change records at %s: pin sl_sync_stages beside sl_sync_changes (sl_sync.h)", path)
	}
	if err != nil {
		return nil, fmt.Errorf("opening the staged change records %s: %w", path, err)
	}
	return &stageReader{m: m}, nil
}

func (s *stageReader) close() {
	if s != nil {
		s.m.Close()
	}
}

// read hands fn the records of every CPU whose stage changed.
func (s *stageReader) read(fn func(raw []byte)) error {
	if s == nil {
		return nil
	}
	if err := s.m.Lookup(uint32(0), &s.vals); err != nil {
		return fmt.Errorf("reading the staged change records: %w", err)
	}
	for len(s.last) < len(s.vals) {
		s.last, s.appends = append(s.last, nil), append(s.appends, 0)
	}
	for cpu := range s.vals {
		v := &s.vals[cpu]
		raw := v.Records[:min(int(v.Len), len(v.Records))]
		if v.Appends == s.appends[cpu] && bytes.Equal(raw, s.last[cpu]) {
			continue
		}
		s.last[cpu], s.appends[cpu] = append(s.last[cpu][:0], raw...), v.Appends
		fn(raw)
	}
	return nil
}
