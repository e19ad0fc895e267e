// Package yamlsrc locates the fields of a YAML source for error messages:
// every problem of a service or policy file names its line and field.
package yamlsrc

import (
	"fmt"
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
