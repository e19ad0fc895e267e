package datapath

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/cilium/ebpf"
)

// verifierBudget bounds the instructions the verifier may process per
// program: the kernel's limit is 1M, and a program near it verifies in
// seconds (tens of seconds under emulation) at every socklane start.
// sl_msg is the largest: 78k on 6.18 by default, 99k with
// --reader-verdict late (its ask on messages and at the owner's quota).
const verifierBudget = 120_000

// TestVerifierBudget: every program the datapath loads verifies within
// verifierBudget instructions on this kernel (a loop carrying an index
// across its iterations took the LB's connect and sendmsg programs to
// ~450k each), with readers given the valve's verdict at their join (the
// default) and late (--reader-verdict late, whose ask and pending join
// add to sl_msg's states).
func TestVerifierBudget(t *testing.T) {
	for _, tc := range []struct {
		name string
		late Mode
	}{
		{"reader-verdict join", ModeOff},
		{"reader-verdict late", ModeOn},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pin := filepath.Join("/sys/fs/bpf", fmt.Sprintf("sltest-vb-%d-%d", os.Getpid(), tc.late))
			s := Settings{Bypass: ModeOn, VerdictWindow: DefaultVerdictWindow, LateVerdict: tc.late}
			if tc.late.On() {
				f, err := ProbeFeatures()
				if err != nil {
					t.Fatalf("probing the kernel: %v", err)
				}
				if !f.ValveFit() {
					t.Skip("this kernel cannot run the valve, which the late verdict gives")
				}
				s.BacklogValve = ModeOn
			}
			verifyWithinBudget(t, testDatapathWith(t, Config{PinDir: pin, Settings: s}))
		})
	}
}

// verifyWithinBudget checks every program of dp against verifierBudget.
func verifyWithinBudget(t *testing.T, dp *Datapath) {
	t.Helper()
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
