package statesync

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/socklane/socklane/internal/syncpb"
	"golang.org/x/sys/unix"
)

// syncable are the map types whose entries are keys and values that mean
// the same on every node. Per-CPU maps, maps of sockets or programs, and
// maps of maps hold node-local things.
var syncable = map[ebpf.MapType]bool{
	ebpf.Hash: true, ebpf.LRUHash: true, ebpf.Array: true, ebpf.LPMTrie: true,
}

// mapInfo is the part of the kernel's struct bpf_map_info this package
// reads: cilium/ebpf does not return the BTF key and value type ids.
type mapInfo struct {
	typ, id, keySize, valueSize, maxEntries, flags uint32
	name                                           [16]byte
	ifindex, btfVmlinuxValueTypeID                 uint32
	netnsDev, netnsIno                             uint64
	btfID, btfKeyTypeID, btfValueTypeID            uint32
	_                                              uint32
	mapExtra                                       uint64
}

type objInfoAttr struct {
	fd      uint32
	infoLen uint32
	info    uint64
}

func readMapInfo(m *ebpf.Map) (mapInfo, error) {
	var info mapInfo
	attr := objInfoAttr{fd: uint32(m.FD()), infoLen: uint32(unsafe.Sizeof(info)), info: uint64(uintptr(unsafe.Pointer(&info)))}
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_OBJ_GET_INFO_BY_FD, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	if errno != 0 {
		return info, fmt.Errorf("reading map info: %w", errno)
	}
	return info, nil
}

// schemaOf describes a pinned map for the peers to compare.
func schemaOf(name string, m *ebpf.Map, mode syncpb.Mode) (*syncpb.TableSchema, error) {
	info, err := readMapInfo(m)
	if err != nil {
		return nil, err
	}
	typ := ebpf.MapType(info.typ)
	if !syncable[typ] {
		return nil, fmt.Errorf("map type %s cannot be synced: only hash, LRU hash, array and LPM trie maps hold values that mean the same on another node", typ)
	}
	s := &syncpb.TableSchema{Name: name, MapType: info.typ, KeySize: info.keySize, ValueSize: info.valueSize, Mode: mode}
	if info.btfID != 0 && info.btfKeyTypeID != 0 {
		h, err := btf.NewHandleFromID(btf.ID(info.btfID))
		if err != nil {
			return nil, fmt.Errorf("opening the map's BTF: %w", err)
		}
		defer h.Close()
		spec, err := h.Spec(nil)
		if err != nil {
			return nil, fmt.Errorf("reading the map's BTF: %w", err)
		}
		if s.KeyType, err = typeText(spec, btf.TypeID(info.btfKeyTypeID)); err != nil {
			return nil, fmt.Errorf("describing the key type: %w", err)
		}
		if s.ValueType, err = typeText(spec, btf.TypeID(info.btfValueTypeID)); err != nil {
			return nil, fmt.Errorf("describing the value type: %w", err)
		}
	}
	return s, nil
}

// typeText writes a BTF type out as a Go declaration (names, fields,
// sizes), the same text for the same C type on every node.
func typeText(spec *btf.Spec, id btf.TypeID) (string, error) {
	typ, err := spec.TypeByID(id)
	if err != nil {
		return "", err
	}
	var gf btf.GoFormatter
	decl, err := gf.TypeDeclaration("T", typ)
	if err != nil {
		return "", err
	}
	if name := typ.TypeName(); name != "" {
		decl = name + ": " + decl
	}
	return decl, nil
}

// compareSchemas says how two nodes' descriptions of one table differ.
func compareSchemas(mine, theirs *syncpb.TableSchema) error {
	var diffs []string
	if mine.GetMapType() != theirs.GetMapType() {
		diffs = append(diffs, fmt.Sprintf("map type %s here, %s there", ebpf.MapType(mine.GetMapType()), ebpf.MapType(theirs.GetMapType())))
	}
	if mine.GetKeySize() != theirs.GetKeySize() {
		diffs = append(diffs, fmt.Sprintf("key size %d here, %d there", mine.GetKeySize(), theirs.GetKeySize()))
	}
	if mine.GetValueSize() != theirs.GetValueSize() {
		diffs = append(diffs, fmt.Sprintf("value size %d here, %d there", mine.GetValueSize(), theirs.GetValueSize()))
	}
	if mine.GetKeyType() != "" && theirs.GetKeyType() != "" && mine.GetKeyType() != theirs.GetKeyType() {
		diffs = append(diffs, fmt.Sprintf("key type %q here, %q there", mine.GetKeyType(), theirs.GetKeyType()))
	}
	if mine.GetValueType() != "" && theirs.GetValueType() != "" && mine.GetValueType() != theirs.GetValueType() {
		diffs = append(diffs, fmt.Sprintf("value type %q here, %q there", mine.GetValueType(), theirs.GetValueType()))
	}
	if mine.GetMode() != theirs.GetMode() {
		diffs = append(diffs, fmt.Sprintf("mode %s here, %s there", modeName(mine.GetMode()), modeName(theirs.GetMode())))
	}
	if len(diffs) == 0 {
		return nil
	}
	return errors.New("table " + mine.GetName() + ": " + strings.Join(diffs, "; "))
}
