package datapath

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/socklane/socklane/internal/service"
)

// TestApplyMemberRoles: a backend that stops being ready stays a member
// (idle: never chosen, its sockets not stale); one that leaves the
// service is stale.
func TestApplyMemberRoles(t *testing.T) {
	dp := testDatapath(t)
	no := false
	set := func(bs ...service.Backend) *service.Set {
		s, err := service.NewSet([]*service.Service{{Name: "a", VIPs: []netip.Addr{netip.MustParseAddr("198.19.3.1")},
			Ports: []service.Port{{Port: 80, TargetPort: 8080}}, Backends: bs}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	b0, b1 := service.Backend{IP: netip.MustParseAddr("198.18.3.1")}, service.Backend{IP: netip.MustParseAddr("198.18.3.2")}
	b1idle := b1
	b1idle.Ready = &no
	states := func() map[string]uint32 {
		out := map[string]uint32{}
		all, err := readAll[servicelbSlMemberKey, servicelbSlMember](dp.lb.SlSvcMembers)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range all {
			out[wordsAddr(k.Be.Ip).String()] = v.State
		}
		return out
	}
	ready, idle := uint32(servicelbSlMemberStateSL_MEMBER_READY), uint32(servicelbSlMemberStateSL_MEMBER_IDLE)
	for _, step := range []struct {
		name   string
		set    *service.Set
		stale  int
		states map[string]uint32
		ready  uint16
	}{
		{"both ready", set(b0, b1), 0, map[string]uint32{"198.18.3.1": ready, "198.18.3.2": ready}, 2},
		{"one not ready", set(b0, b1idle), 0, map[string]uint32{"198.18.3.1": ready, "198.18.3.2": idle}, 1},
		{"ready again", set(b0, b1), 0, map[string]uint32{"198.18.3.1": ready, "198.18.3.2": ready}, 2},
		{"not ready, then gone", set(b0, b1idle), 0, map[string]uint32{"198.18.3.1": ready, "198.18.3.2": idle}, 1},
		{"gone", set(b0), 1, map[string]uint32{"198.18.3.1": ready}, 1},
	} {
		st, err := dp.ApplyServices(step.set)
		if err != nil {
			t.Fatal(err)
		}
		if st.Stale != step.stale {
			t.Errorf("%s: %d stale members, want %d", step.name, st.Stale, step.stale)
		}
		got := states()
		if len(got) != len(step.states) {
			t.Errorf("%s: members %v, want %v", step.name, got, step.states)
		}
		for ip, s := range step.states {
			if got[ip] != s {
				t.Errorf("%s: members %v, want %v", step.name, got, step.states)
			}
		}
		var v servicelbSlSvcVal
		if err := dp.lb.SlSvc.Lookup(servicelbSlSvcKey{Ip: addrWords(netip.MustParseAddr("198.19.3.1")), Port: 80, Proto: 6}, &v); err != nil || v.Ready != step.ready {
			t.Errorf("%s: frontend %+v %v, want %d ready", step.name, v, err, step.ready)
		}
	}
}

// TestExpireAffinity: entries unused past their frontend's timeout, or of
// a frontend gone, are removed and their owner's charge returned; a fresh
// one stays.
func TestExpireAffinity(t *testing.T) {
	dp := testDatapath(t)
	timeout := uint32(60)
	set, err := service.NewSet([]*service.Service{{Name: "a", VIPs: []netip.Addr{netip.MustParseAddr("198.19.3.1")},
		Ports: []service.Port{{Port: 80, TargetPort: 8080}}, Affinity: service.AffinityClientIP, TimeoutS: &timeout,
		Backends: []service.Backend{{IP: netip.MustParseAddr("198.18.3.1")}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dp.ApplyServices(set); err != nil {
		t.Fatal(err)
	}
	var fv servicelbSlSvcVal
	if err := dp.lb.SlSvc.Lookup(servicelbSlSvcKey{Ip: addrWords(netip.MustParseAddr("198.19.3.1")), Port: 80, Proto: 6}, &fv); err != nil {
		t.Fatal(err)
	}
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	const owner = uint64(424242)
	put := func(netns uint64, id uint32, last uint64) {
		t.Helper()
		if err := dp.lb.SlSvcAffinity.Update(servicelbSlAffinityKey{Netns: netns, Id: id}, servicelbSlAffinity{LastNs: last, Owner: owner}, ebpf.UpdateNoExist); err != nil {
			t.Fatal(err)
		}
	}
	put(1, fv.Id, now)                        // fresh
	put(2, fv.Id, now-uint64(61*time.Second)) // expired
	put(3, fv.Id+1000, now)                   // its frontend is gone
	if err := dp.lb.SlLbOwners.Update(owner, servicelbSlLbOwner{Affinity: 3}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	n, err := dp.ExpireAffinity()
	if err != nil || n != 2 {
		t.Fatalf("expired %d (%v), want 2", n, err)
	}
	left, err := dp.Affinities()
	if err != nil || len(left) != 1 || left[0].Netns != 1 {
		t.Errorf("left %+v (%v), want the fresh entry", left, err)
	}
	var o servicelbSlLbOwner
	if err := dp.lb.SlLbOwners.Lookup(owner, &o); err != nil || o.Affinity != 1 {
		t.Errorf("owner %+v (%v), want its charge down to 1", o, err)
	}
}

// TestApplyMirror: applies diff against what the datapath last wrote
// (one changed service of many writes its own entries only, and the
// mirror matches the maps); an apply through another handle makes it
// stale, and forgetting it reads the maps again.
func TestApplyMirror(t *testing.T) {
	dp := testDatapath(t)
	n := 10000
	if testing.Short() {
		n = 1000
	}
	if _, err := dp.ApplyServices(manyServices(t, n, 0)); err != nil {
		t.Fatal(err)
	}
	same := func(what string) { mirrorMatchesMaps(t, dp, what) }
	same("created")
	for _, changed := range []int{1, 0, 1, 0, 1, n / 2} {
		st, err := dp.ApplyServices(manyServices(t, n, changed))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d services, %d changed: applied in %s (%d updated)", n, changed, st.Took, st.Updated)
		same(fmt.Sprintf("%d changed", changed))
	}
	// Another handle applies (another process would): this one's
	// mirror is stale until forgotten.
	other, err := Open(dp.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.ApplyServices(manyServices(t, 10, 0)); err != nil {
		t.Fatal(err)
	}
	other.Close()
	dp.ForgetServiceMirror()
	if _, err := dp.ApplyServices(manyServices(t, n, 0)); err != nil {
		t.Fatal(err)
	}
	same("after another handle's apply")
}

// mirrorMatchesMaps: what dp remembers of the service maps is what they
// hold.
func mirrorMatchesMaps(t *testing.T, dp *Datapath, what string) {
	t.Helper()
	read, err := dp.readMirror()
	if err != nil {
		t.Fatal(err)
	}
	if dp.lbm == nil || len(read.svcs) != len(dp.lbm.svcs) || len(read.slots) != len(dp.lbm.slots) || len(read.members) != len(dp.lbm.members) {
		t.Fatalf("%s: the mirror differs from the maps", what)
	}
	for k, v := range read.svcs {
		if dp.lbm.svcs[k] != v {
			t.Fatalf("%s: frontend %+v is %+v in the maps, %+v in the mirror", what, k, v, dp.lbm.svcs[k])
		}
	}
	for k, v := range read.slots {
		if dp.lbm.slots[k] != v {
			t.Fatalf("%s: slot %+v differs", what, k)
		}
	}
	for id, ms := range read.members {
		for b, s := range ms {
			if dp.lbm.members[id][b] != s {
				t.Fatalf("%s: member %d %+v differs", what, id, b)
			}
		}
	}
}
