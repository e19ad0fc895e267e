package statesync

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// tracer captures the writes of a synced map that no program records
// changes for, by tracing the kernel's update and delete functions of the
// map's type (trace.c): change records like a writer's, from every
// program and from user space.
type tracer struct {
	objs  traceObjects
	links []link.Link
}

// traceTargets are the kernel functions that update and delete entries
// of a map of type t.
func traceTargets(t ebpf.MapType) (update, del string, err error) {
	switch t {
	case ebpf.Hash:
		return "htab_map_update_elem", "htab_map_delete_elem", nil
	case ebpf.LRUHash:
		return "htab_lru_map_update_elem", "htab_lru_map_delete_elem", nil
	case ebpf.Array:
		return "array_map_update_elem", "array_map_delete_elem", nil
	}
	return "", "", fmt.Errorf("no traced writes for maps of type %s", t)
}

// newTracer loads and attaches the tracer of m, whose records carry
// record. It fails where the kernel cannot trace functions (no fentry).
func newTracer(m *ebpf.Map, record uint32) (*tracer, error) {
	upd, del, err := traceTargets(m.Type())
	if err != nil {
		return nil, err
	}
	if m.KeySize() > uint32(churnSlSyncLimitsSL_SYNC_MAX_KEY) {
		return nil, fmt.Errorf("keys of %d bytes: change records carry at most %d", m.KeySize(), churnSlSyncLimitsSL_SYNC_MAX_KEY)
	}
	info, err := m.Info()
	if err != nil {
		return nil, fmt.Errorf("reading the map's id: %w", err)
	}
	id, ok := info.ID()
	if !ok {
		return nil, errors.New("the kernel does not say the map's id")
	}
	spec, err := loadTrace()
	if err != nil {
		return nil, fmt.Errorf("loading the tracer: %w", err)
	}
	var s traceSpecs
	if err := spec.Assign(&s); err != nil {
		return nil, fmt.Errorf("loading the tracer: %w", err)
	}
	if err := s.SlTraceSettings.Set(traceSlTraceCfg{MapId: uint32(id), KeySize: m.KeySize(), Table: record}); err != nil {
		return nil, fmt.Errorf("setting the tracer's map: %w", err)
	}
	s.SlTraceUpdate.AttachTo, s.SlTraceDelete.AttachTo = upd, del
	t := &tracer{}
	if err := spec.LoadAndAssign(&t.objs, nil); err != nil {
		return nil, fmt.Errorf("loading the tracer of %s and %s (fexit): %w", upd, del, err)
	}
	for _, p := range []*ebpf.Program{t.objs.SlTraceUpdate, t.objs.SlTraceDelete} {
		l, err := link.AttachTracing(link.TracingOptions{Program: p, AttachType: ebpf.AttachTraceFExit})
		if err != nil {
			t.close()
			return nil, fmt.Errorf("attaching the tracer (fexit): %w", err)
		}
		t.links = append(t.links, l)
	}
	return t, nil
}

// source is where the tracer's records are.
func (t *tracer) source() recordSource {
	return recordSource{ring: t.objs.SlSyncChanges, lost: t.objs.SlSyncLost, what: "traced map updates"}
}

func (t *tracer) close() {
	for _, l := range t.links {
		l.Close()
	}
	t.objs.Close()
}
