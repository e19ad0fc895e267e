// Package yamlsrc locates the fields of a YAML source for error messages:
// every problem of a service or policy file names its line and field.
package yamlsrc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// FieldError is a problem at one place of a source.
type FieldError struct {
	Line  int    // 1-based line in the source; 0 if unknown
	Field string // path such as services[2].ports[0].protocol
	Msg   string
}

func (e *FieldError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("line %d: %s: %s", e.Line, e.Field, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.Field, e.Msg)
}

// Errors is every problem found; nothing of a source with errors applies.
type Errors []*FieldError

func (es Errors) Error() string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// Index is the node of every field path (services[0].ports[1].port): the
// key's node for a mapping entry (the value's for a scalar), the item's
// for a sequence element.
type Index map[string]*yaml.Node

// NewIndex indexes a parsed document.
func NewIndex(root *yaml.Node) Index {
	idx := Index{}
	idx.add(root, "")
	return idx
}

func (idx Index) add(n *yaml.Node, path string) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			idx.add(c, path)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			idx[p] = k
			if v.Kind == yaml.ScalarNode {
				idx[p] = v
			}
			idx.add(v, p)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := path + "[" + strconv.Itoa(i) + "]"
			idx[p] = c
			idx.add(c, p)
		}
	}
}

// Line is the line of field, or of its nearest parent present (a missing
// field is reported at its parent); 0 if none is.
func (idx Index) Line(field string) int {
	for field != "" {
		if n, ok := idx[field]; ok {
			return n.Line
		}
		i := strings.LastIndexAny(field, ".[")
		if i < 0 {
			break
		}
		field = field[:i]
	}
	return 0
}

// MaxSize bounds a source file.
const MaxSize = 64 << 20

// Read parses a source of the named kind ("service", "policy") and
// indexes its fields.
func Read(src []byte, what string) (Index, error) {
	if len(src) > MaxSize {
		return nil, fmt.Errorf("%s file is %d bytes, at most %d", what, len(src), MaxSize)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(src, &root); err != nil {
		return nil, fmt.Errorf("parsing YAML: %w", err)
	}
	return NewIndex(&root), nil
}

// DecodeStrict decodes the source's one document into out, refusing
// fields out does not have (with their line).
func DecodeStrict(src []byte, what string, out any) error {
	dec := yaml.NewDecoder(bytes.NewReader(src))
	dec.KnownFields(true)
	if err := dec.Decode(out); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("reading %s file: %w", what, err)
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return fmt.Errorf("the %s file holds more than one YAML document", what)
	}
	return nil
}
