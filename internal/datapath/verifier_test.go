package datapath

import (
	"reflect"
	"testing"

	"github.com/cilium/ebpf"
)

// verifierBudget bounds the instructions the verifier may process per
// program: the kernel's limit is 1M, and a program near it verifies in
// seconds (tens of seconds under emulation) at every socklane start.
const verifierBudget = 100_000

// TestVerifierBudget: every program the datapath loads verifies within
// verifierBudget instructions on this kernel (a loop carrying an index
// across its iterations took the LB's connect and sendmsg programs to
// ~450k each).
func TestVerifierBudget(t *testing.T) {
	dp := testDatapath(t)
	progs := 0
	for _, objs := range []any{&dp.objs.bypassPrograms, &dp.lb.servicelbPrograms, &dp.pt.portsPrograms} {
		v := reflect.ValueOf(objs).Elem()
		for i := 0; i < v.NumField(); i++ {
			p, ok := v.Field(i).Interface().(*ebpf.Program)
			if !ok || p == nil {
				continue
			}
			progs++
			info, err := p.Info()
			if err != nil {
				t.Fatalf("reading %s's info: %v", v.Type().Field(i).Name, err)
			}
			n, ok := info.VerifiedInstructions()
			if !ok {
				t.Skipf("this kernel does not report verified instructions (Linux 5.16+)")
			}
			t.Logf("%s: %d instructions processed", info.Name, n)
			if n > verifierBudget {
				t.Errorf("%s: the verifier processed %d instructions, budget %d", info.Name, n, verifierBudget)
			}
		}
	}
	if progs < 8 {
		t.Errorf("%d programs checked, want every program of the three objects (>= 8)", progs)
	}
}
