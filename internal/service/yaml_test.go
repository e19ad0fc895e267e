package service

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name, src string
		want      string // substring of the error; empty: valid
	}{
		{"minimal", "services:\n  - name: a\n    vips: [198.19.0.1]\n    ports: [{port: 80}]\n", ""},
		{"dual stack", "services:\n  - name: a\n    vips: [198.19.0.1, '2001:db8::1']\n    ports: [{port: 53, protocol: udp}]\n    backends: [{ip: 198.18.0.2}, {ip: '2001:db8::2'}]\n", ""},
		{"empty file", "", ""},
		{"two v4 vips", "services:\n  - name: a\n    vips: [198.19.0.1, 198.19.0.2]\n    ports: [{port: 80}]\n", "line 3: services[0].vips[1]: at most one IPv4"},
		{"no ports", "services:\n  - name: a\n    vips: [198.19.0.1]\n", "services[0].ports: a service needs at least one port"},
		{"mapped vip", "services:\n  - name: a\n    vips: ['::ffff:198.19.0.1']\n    ports: [{port: 80}]\n", "dotted form"},
		{"duplicate backend", "services:\n  - name: a\n    vips: [198.19.0.1]\n    ports: [{port: 80}]\n    backends: [{ip: 198.18.0.2}, {ip: 198.18.0.2}]\n", "listed twice"},
		{"timeout without affinity", "services:\n  - name: a\n    vips: [198.19.0.1]\n    ports: [{port: 80}]\n    sessionAffinityTimeoutSeconds: 5\n", "only with sessionAffinity"},
		{"bad ip with line", "services:\n  - name: a\n    vips: [198.19.0.1]\n    ports: [{port: 80}]\n    backends:\n      - ip: nope\n", "line 6: services[0].backends[0].ip"},
		{"two documents", "services: []\n---\nservices: []\n", "more than one YAML document"},
		{"port out of range", "services:\n  - name: a\n    vips: [198.19.0.1]\n    ports: [{port: 70000}]\n", "line 4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, err := Parse([]byte(tt.src))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to say %q", err, tt.want)
			}
			if set != nil {
				t.Fatal("an invalid source yielded a set")
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	set, err := Parse([]byte("services:\n  - name: a\n    vips: [198.19.0.1]\n    ports: [{port: 80}]\n    sessionAffinity: ClientIP\n    backends: [{ip: 198.18.0.2, terminating: true}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	s := set.Find("a")
	if s == nil || s.Namespace != "default" || s.Ports[0].Protocol != TCP || s.Ports[0].TargetPort != 80 || s.Timeout != 3*time.Hour {
		t.Fatalf("defaults not filled: %+v", s)
	}
	if s.Backends[0].IsReady() {
		t.Fatal("a terminating backend counted as ready")
	}
}

func TestAllErrorsReported(t *testing.T) {
	_, err := Parse([]byte("services:\n  - name: A\n    vips: []\n    ports: [{port: 0, protocol: x}]\n"))
	var es Errors
	if !errors.As(err, &es) || len(es) < 4 {
		t.Fatalf("want every problem reported, got %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("services:\n  - name: a\n    vips: [198.19.0.1]\n    ports: [{port: 80}]\n    backends: [{ip: 198.18.0.2}]\n"))
	f.Add([]byte("services: [{name: b, vips: ['2001:db8::1'], ports: [{port: 1, protocol: UDP}]}]"))
	f.Fuzz(func(t *testing.T, src []byte) {
		set, err := Parse(src)
		if err == nil && set != nil {
			for _, s := range set.Services {
				if len(s.VIPs) == 0 || len(s.Ports) == 0 {
					t.Fatalf("accepted a service without VIP or port: %+v", s)
				}
			}
		}
	})
}
