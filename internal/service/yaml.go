package service

import (
	"cmp"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"slices"

	"github.com/socklane/socklane/internal/yamlsrc"
	"gopkg.in/yaml.v3"
)

// File is the YAML service source:
//
//	services:
//	  - name: web
//	    namespace: shop            # default: default
//	    vips: [198.19.0.10, "2001:db8:19::10"]
//	    ports:
//	      - {name: http, port: 80, protocol: TCP, targetPort: 8080}
//	    sessionAffinity: ClientIP  # or None (default)
//	    sessionAffinityTimeoutSeconds: 600
//	    backends:
//	      - {ip: 198.18.1.2}
//	      - {ip: 198.18.1.3, terminating: true}
type File struct {
	Services []*Service `yaml:"services"`
}

// Parse reads and validates a YAML service source. Every problem is
// reported with its line and field; a source with any problem yields no Set.
func Parse(src []byte) (*Set, error) {
	idx, err := yamlsrc.Read(src, "service")
	if err != nil {
		return nil, err
	}
	// Addresses first: their parse errors would otherwise lack a line.
	var addrErrs Errors
	for path, n := range idx {
		if n.Kind == yaml.ScalarNode && addrField.MatchString(path) {
			if _, err := netip.ParseAddr(n.Value); err != nil {
				addrErrs = append(addrErrs, &FieldError{Line: n.Line, Field: path, Msg: fmt.Sprintf("%q is not an IP address", n.Value)})
			}
		}
	}
	if len(addrErrs) > 0 {
		slices.SortFunc(addrErrs, func(a, b *FieldError) int { return cmp.Compare(a.Line, b.Line) })
		return nil, addrErrs
	}
	var f File
	if err := yamlsrc.DecodeStrict(src, "service", &f); err != nil {
		return nil, err
	}
	return normalise(f.Services, idx.Line)
}

// ParseFile is Parse on a file's contents.
func ParseFile(path string) (*Set, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading service file: %w", err)
	}
	set, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return set, nil
}

// addrField matches the paths of address fields.
var addrField = regexp.MustCompile(`^services\[\d+\]\.(vips\[\d+\]|backends\[\d+\]\.ip)$`)
