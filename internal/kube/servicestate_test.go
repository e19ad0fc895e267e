package kube

import (
	"cmp"
	"encoding/json"
	"fmt"
	goslices "slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/socklane/socklane/internal/service"
)

// TestServiceStateCost: with 10,000 Services in the informers' caches, an
// EndpointSlice's change builds its own Service only and yields one
// outcome; a Service taking another's cluster IP is judged with it (the
// earlier by name keeps it), a deletion frees it again; after each step
// the incremental answer is the whole Build and Partition of the caches.
// A change of the node builds every Service.
func TestServiceStateCost(t *testing.T) {
	n := 10000
	if testing.Short() {
		n = 1000
	}
	svcIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	esIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{byService: indexByService})
	mk := func(i int, ip string, backend string) (*corev1.Service, *discoveryv1.EndpointSlice) {
		name := fmt.Sprintf("s%05d", i)
		k := svc(name, []string{ip}, corev1.ServiceTypeClusterIP, corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)})
		es := slice(name, name+"-a", []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr[int32](8080), Protocol: ptr(corev1.ProtocolTCP)}},
			endpoint(backend, true, true, false), endpoint("198.18.9.9", true, true, false))
		return k, es
	}
	vip := func(i int) string { return fmt.Sprintf("198.19.%d.%d", (i+1)>>8, (i+1)&255) }
	for i := range n {
		k, es := mk(i, vip(i), "198.18.1.1")
		must(t, svcIdx.Add(k))
		must(t, esIdx.Add(es))
	}
	st := newServiceState(corelisters.NewServiceLister(svcIdx), esIdx, service.Budget{})
	node := Node{Name: "n1"}
	step := func(what string, wantBuilt, wantChanged int) {
		t.Helper()
		start := time.Now()
		keys, _, err := st.take()
		if err != nil {
			t.Fatal(err)
		}
		changes, _, err := st.build(keys, node)
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		t.Logf("%s: %d services built, %d outcomes, in %s", what, len(keys), len(changes), took)
		if len(keys) != wantBuilt || len(changes) != wantChanged {
			t.Fatalf("%s: built %d, %d outcomes; want %d and %d", what, len(keys), len(changes), wantBuilt, wantChanged)
		}
		// The whole answer, from scratch.
		var svcs []*corev1.Service
		for _, o := range svcIdx.List() {
			svcs = append(svcs, o.(*corev1.Service))
		}
		var slices []*discoveryv1.EndpointSlice
		for _, o := range esIdx.List() {
			slices = append(slices, o.(*discoveryv1.EndpointSlice))
		}
		built, ignored, _ := Build(svcs, slices, node)
		wantSet, wantSkipped := service.Partition(built, service.Budget{})
		wantSkipped = append(wantSkipped, ignored...)
		goslices.SortFunc(wantSkipped, func(a, b service.Skipped) int { return cmp.Compare(a.Service, b.Service) })
		gotSet, gotSkipped := st.part.Snapshot()
		if a, b := mustJSON(t, gotSet.Services), mustJSON(t, wantSet.Services); a != b {
			t.Fatalf("%s: the incremental set differs from the whole build", what)
		}
		if a, b := mustJSON(t, gotSkipped), mustJSON(t, wantSkipped); a != b && len(gotSkipped)+len(wantSkipped) > 0 {
			t.Fatalf("%s: skipped %s, the whole build skips %s", what, a, b)
		}
	}
	st.mark(true)
	step("start", n, n)
	// One slice's endpoint changes.
	_, es := mk(42, vip(42), "198.18.1.2")
	must(t, esIdx.Update(es))
	st.sliceHandler().OnUpdate(es, es)
	step("one endpointslice", 1, 1)
	// A new Service claims s00042's cluster IP: only the two are
	// judged; the later name is skipped.
	k, es := mk(n+1, vip(42), "198.18.1.3")
	must(t, svcIdx.Add(k))
	must(t, esIdx.Add(es))
	st.serviceHandler().OnAdd(k, false)
	st.sliceHandler().OnAdd(es, false)
	step("a clashing service", 1, 1)
	// s00042 goes: the newcomer takes its address.
	old, _, _ := svcIdx.GetByKey("shop/s00042")
	must(t, svcIdx.Delete(old))
	st.serviceHandler().OnDelete(old)
	step("the holder deleted", 1, 2)
	// Nothing changed: nothing built.
	st.mark(false)
	step("no change", 0, 0)
	// The node changed: every Service is built and handed on (the
	// datapath then writes what differs: nothing).
	st.nodeHandler().OnUpdate(nil, nil)
	step("node", n, n)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
