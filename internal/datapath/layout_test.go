package datapath

import (
	"crypto/sha256"
	_ "embed"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

//go:embed testdata/layout.golden
var layoutGoldenData []byte

var updateLayout = flag.Bool("update-layout", false, "record the current layout fingerprint with SL_LAYOUT_VERSION in testdata/layout.golden")

const layoutGolden = "testdata/layout.golden"

// TestLayoutFingerprint: the pinned maps' structure (types, sizes, flags,
// and every key and value type down to member offsets) is recorded with
// the layout version. A structural change without a new SL_LAYOUT_VERSION
// fails, so adopters of older pins are refused instead of misreading them.
func TestLayoutFingerprint(t *testing.T) {
	fp, err := layoutFingerprint()
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprintf("version %d\nfingerprint %s\n", LayoutVersion, fp)
	// Embedded: the test binary also runs where the tree is not (the
	// kernel matrix).
	want := layoutGoldenData
	var wantVersion uint32
	var wantFP string
	_, _ = fmt.Sscanf(string(want), "version %d\nfingerprint %s\n", &wantVersion, &wantFP) // an unreadable file reads as version 0
	switch {
	case wantVersion == LayoutVersion && wantFP == fp:
		return
	case wantVersion == LayoutVersion:
		t.Fatalf("the pinned maps' layout changed but SL_LAYOUT_VERSION is still %d: bump it in sl_consts.h, run go generate, then go test ./internal/datapath -run TestLayoutFingerprint -update-layout", LayoutVersion)
	case *updateLayout:
		if err := os.WriteFile(layoutGolden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("SL_LAYOUT_VERSION is %d, %s records %d: run go test ./internal/datapath -run TestLayoutFingerprint -update-layout", LayoutVersion, layoutGolden, wantVersion)
	}
}

func layoutFingerprint() (string, error) {
	var lines []string
	for _, load := range []func() (*ebpf.CollectionSpec, error){loadBypass, loadServicelb} {
		spec, err := load()
		if err != nil {
			return "", err
		}
		for _, m := range spec.Maps {
			if !strings.HasPrefix(m.Name, "sl_") {
				continue
			}
			lines = append(lines, fmt.Sprintf("%s %v k%d v%d n%d f%#x key{%s} value{%s}", m.Name, m.Type, m.KeySize, m.ValueSize, m.MaxEntries, m.Flags, typeLayout(m.Key, 0), typeLayout(m.Value, 0)))
		}
	}
	slices.Sort(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return fmt.Sprintf("%x", sum[:12]), nil
}

// typeLayout writes a type's shape: sizes, member names and offsets.
func typeLayout(t btf.Type, depth int) string {
	if t == nil || depth > 8 {
		return ""
	}
	t = btf.UnderlyingType(t)
	size, _ := btf.Sizeof(t)
	switch v := t.(type) {
	case *btf.Struct:
		return fmt.Sprintf("struct%d(%s)", size, members(v.Members, depth))
	case *btf.Union:
		return fmt.Sprintf("union%d(%s)", size, members(v.Members, depth))
	case *btf.Array:
		return fmt.Sprintf("[%d]%s", v.Nelems, typeLayout(v.Type, depth+1))
	case *btf.Enum:
		var vals []string
		for _, e := range v.Values {
			vals = append(vals, fmt.Sprintf("%s=%d", e.Name, e.Value))
		}
		return fmt.Sprintf("enum%d(%s)", size, strings.Join(vals, ","))
	default:
		return fmt.Sprintf("%T%d", t, size)
	}
}

func members(ms []btf.Member, depth int) string {
	var out []string
	for _, m := range ms {
		out = append(out, fmt.Sprintf("%s@%d:%d=%s", m.Name, m.Offset, m.BitfieldSize, typeLayout(m.Type, depth+1)))
	}
	return strings.Join(out, ",")
}
