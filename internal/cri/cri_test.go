package cri

import "testing"

func TestSelector(t *testing.T) {
	cases := []struct {
		sel    string
		labels map[string]string
		match  bool
		bad    bool
	}{
		{"app=web", map[string]string{"app": "web", "tier": "x"}, true, false},
		{"app=web,tier=x", map[string]string{"app": "web", "tier": "x"}, true, false},
		{"app=web,tier=y", map[string]string{"app": "web", "tier": "x"}, false, false},
		{"app=", map[string]string{"app": ""}, true, false},
		{"app", nil, false, true},
		{"=web", nil, false, true},
	}
	for _, tc := range cases {
		s, err := ParseSelector(tc.sel)
		if (err != nil) != tc.bad {
			t.Errorf("ParseSelector(%q): %v", tc.sel, err)
			continue
		}
		if err == nil && s.Matches(tc.labels) != tc.match {
			t.Errorf("%q matches %v: %v, want %v", tc.sel, tc.labels, !tc.match, tc.match)
		}
	}
}

func TestCommonParent(t *testing.T) {
	cases := []struct {
		in   []string
		want string
	}{
		{[]string{"/sys/fs/cgroup/kubepods/pod1/c1", "/sys/fs/cgroup/kubepods/pod1/c2"}, "/sys/fs/cgroup/kubepods/pod1"},
		{[]string{"/sys/fs/cgroup/kubepods/pod1/c1"}, "/sys/fs/cgroup/kubepods/pod1"},
		{[]string{"/a/x", "/b/y"}, ""},
		{nil, ""},
	}
	for _, tc := range cases {
		if got := commonParent(tc.in); got != tc.want {
			t.Errorf("commonParent(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestFindAndPID(t *testing.T) {
	pods := []Pod{{Namespace: "default", Name: "web", State: "ready"}, {Namespace: "kube-system", Name: "dns", State: "notready"}}
	if p, err := Find(pods, "web"); err != nil || p.Name != "web" {
		t.Errorf("Find(web): %v %v", p, err)
	}
	if _, err := Find(pods, "kube-system/dns"); err == nil {
		t.Errorf("Find returned a pod that is not running")
	}
	if pid := verbosePID(map[string]string{"info": `{"pid": 4242, "other": 1}`}); pid != 4242 {
		t.Errorf("verbosePID = %d", pid)
	}
	if pid := verbosePID(map[string]string{"info": "not json"}); pid != 0 {
		t.Errorf("verbosePID of junk = %d", pid)
	}
}
