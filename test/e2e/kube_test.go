package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/template"
	"time"

	"gopkg.in/yaml.v3"
	appsv1 "k8s.io/api/apps/v1"
	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/socklane/socklane/internal/node"
	"github.com/socklane/socklane/internal/ports"
	"github.com/socklane/socklane/internal/testutil"
)

// renderChart renders the Helm chart's templates with its values, as
// helm template does for the constructs the chart uses (values, release,
// if, quote).
func renderChart(t *testing.T, dir, release, namespace string, set map[string]any) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]any{}
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	for k, v := range set {
		values[k] = v
	}
	files, err := filepath.Glob(filepath.Join(dir, "templates", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("chart templates: %v", err)
	}
	var out bytes.Buffer
	for _, f := range files {
		tpl, err := template.New(filepath.Base(f)).Option("missingkey=error").Funcs(template.FuncMap{
			"quote": func(v any) string { return fmt.Sprintf("%q", fmt.Sprint(v)) },
			"or":    func(a, b any) bool { return truthy(a) || truthy(b) },
			// Helm's (sprig's) toYaml and indent.
			"toYaml": func(v any) (string, error) {
				b, err := yaml.Marshal(v)
				return strings.TrimSuffix(string(b), "\n"), err
			},
			"indent": func(n int, s string) string {
				pad := strings.Repeat(" ", n)
				return pad + strings.ReplaceAll(s, "\n", "\n"+pad)
			},
		}).ParseFiles(f)
		if err != nil {
			t.Fatalf("parsing %s: %v", f, err)
		}
		out.WriteString("---\n")
		if err := tpl.Execute(&out, map[string]any{
			"Values":  values,
			"Release": map[string]any{"Name": release, "Namespace": namespace},
		}); err != nil {
			t.Fatalf("rendering %s: %v", f, err)
		}
		out.WriteString("\n")
	}
	return out.Bytes()
}

// dryRun sends every object of a multi-document manifest to the API
// server with dryRun=All (server-side validation, admission and
// defaulting, nothing stored) and returns them decoded.
func dryRun(t *testing.T, cs kubernetes.Interface, manifest []byte) []runtime.Object {
	t.Helper()
	ctx := context.Background()
	opts := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	var objs []runtime.Object
	for i, doc := range strings.Split(string(manifest), "\n---") {
		if strings.TrimSpace(strings.TrimPrefix(doc, "---")) == "" || isComment(doc) {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("document %d does not decode: %v\n%s", i, err, doc)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = cs.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, opts)
		case *rbacv1.ClusterRole:
			_, err = cs.RbacV1().ClusterRoles().Create(ctx, o, opts)
		case *rbacv1.ClusterRoleBinding:
			_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, o, opts)
		case *rbacv1.Role:
			_, err = cs.RbacV1().Roles(o.Namespace).Create(ctx, o, opts)
		case *rbacv1.RoleBinding:
			_, err = cs.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, opts)
		case *appsv1.DaemonSet:
			_, err = cs.AppsV1().DaemonSets(o.Namespace).Create(ctx, o, opts)
		case *corev1.ConfigMap:
			_, err = cs.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, opts)
		default:
			t.Fatalf("document %d: unexpected kind %T", i, obj)
		}
		if err != nil {
			t.Fatalf("server-side dry run of document %d (%T): %v", i, obj, err)
		}
		objs = append(objs, obj)
	}
	return objs
}

// checkMetricsExposure: /metrics is on the node's loopback unless a web
// configuration (TLS and authentication) is mounted; the probes use the
// loopback health address, which needs no credentials.
func checkMetricsExposure(t *testing.T, what string, ds *appsv1.DaemonSet, webConfig bool) {
	t.Helper()
	c := ds.Spec.Template.Spec.Containers[0]
	args := strings.Join(c.Args, " ")
	if webConfig {
		if !strings.Contains(args, "--web-config-file=/etc/socklane/web/web-config.yml") || !strings.Contains(args, "--metrics-address=$(NODE_IP):") {
			t.Errorf("%s: args %s, want the node address with --web-config-file", what, args)
		}
		mounted := false
		for _, v := range ds.Spec.Template.Spec.Volumes {
			mounted = mounted || v.Secret != nil && v.Secret.SecretName == "socklane-web"
		}
		if !mounted {
			t.Errorf("%s: the web configuration Secret is not mounted", what)
		}
	} else if !strings.Contains(args, "--metrics-address=127.0.0.1:") || strings.Contains(args, "--metrics-insecure") {
		t.Errorf("%s: args %s, want /metrics on loopback", what, args)
	}
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Host != "127.0.0.1" || !strings.Contains(args, fmt.Sprintf("--health-address=127.0.0.1:%d", p.HTTPGet.Port.IntValue())) {
			t.Errorf("%s: probe %+v does not use the loopback health address (args %s)", what, p, args)
		}
	}
}

// truthy is Helm's notion of a set value.
func truthy(v any) bool {
	switch v := v.(type) {
	case nil:
		return false
	case bool:
		return v
	case string:
		return v != ""
	}
	return true
}

func isComment(doc string) bool {
	for _, l := range strings.Split(doc, "\n") {
		if l = strings.TrimSpace(l); l != "" && l != "---" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

// TestDeploy validates deploy/kubernetes and the Helm chart against a real
// API server (server-side dry run), and checks that the agent's
// ServiceAccount may read exactly Services, EndpointSlices and Nodes (its
// own zone label).
func TestDeploy(t *testing.T) {
	api := testutil.StartAPIServer(t)
	root := filepath.Join("..", "..", "deploy")
	manifest, err := os.ReadFile(filepath.Join(root, "kubernetes", "socklane.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs := dryRun(t, api.Client, manifest)
	if len(objs) != 4 {
		t.Errorf("%d objects in deploy/kubernetes/socklane.yaml, want 4", len(objs))
	}
	for _, o := range objs {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			checkMetricsExposure(t, "deploy/kubernetes/socklane.yaml", ds, false)
		}
	}
	syncSet := map[string]any{"enabled": true, "port": 7400, "certSecret": "socklane-sync", "lease": "lb-pair", "pods": true,
		"maps": []any{"/sys/fs/bpf/lb/conntrack,changes=/sys/fs/bpf/lb,mode=active-standby"}}
	portsSet := map[string]any{"workloads": []any{map[string]any{"name": "ci-a", "selector": "app=ci", "ports": []any{map[string]any{"port": 3000}}, "pool": "20000-20099"}}}
	for _, set := range []map[string]any{{}, {"podSelector": "app=web", "kubeServices": false}, {"kubePodSelector": "app=web"}, {"kubePodSelector": "app=web", "kubePolicies": true}, {"metricsWebConfigSecret": "socklane-web"}, {"sync": syncSet}, {"kubePodSelector": "app=web", "kubePolicies": true, "sync": syncSet},
		{"kubePodSelector": "app=web", "kubePolicies": true, "kubeServices": false, "sync": syncSet}, {"ports": portsSet}} {
		chart := renderChart(t, filepath.Join(root, "helm", "socklane"), "sl", "kube-system", set)
		objs := dryRun(t, api.Client, chart)
		var args []string
		for _, o := range objs {
			if ds, ok := o.(*appsv1.DaemonSet); ok {
				args = ds.Spec.Template.Spec.Containers[0].Args
				checkMetricsExposure(t, fmt.Sprintf("chart with %v", set), ds, set["metricsWebConfigSecret"] != nil)
			}
		}
		joined := strings.Join(args, " ")
		if strings.Contains(joined, "--ports=/etc/socklane/ports/ports.yaml") != (set["ports"] != nil) {
			t.Errorf("chart with %v: agent args %v", set, args)
		}
		for _, o := range objs {
			cm, ok := o.(*corev1.ConfigMap)
			if !ok {
				continue
			}
			// The rendered file is one the agent accepts.
			if _, err := ports.Parse([]byte(cm.Data["ports.yaml"])); err != nil || set["ports"] == nil {
				t.Errorf("chart with %v: ConfigMap %s: %v\n%s", set, cm.Name, err, cm.Data["ports.yaml"])
			}
		}
		// The pods go through the sync only where policies need them,
		// and the agent then lists the nodes (whose pods to keep).
		if strings.Contains(joined, "--sync-pods") != (set["sync"] != nil && set["kubePolicies"] == true) {
			t.Errorf("chart with %v: agent args %v", set, args)
		}
		if strings.Contains(joined, "--sync-pods") && !clusterRoleGrants(objs, "nodes", "list") {
			t.Errorf("chart with %v: --sync-pods without a ClusterRole that lists nodes", set)
		}
		if set["sync"] != nil {
			for _, want := range []string{"--sync-listen=$(NODE_IP):7400", "--sync-peers-from=kube-system/app.kubernetes.io/name=socklane,app.kubernetes.io/instance=sl",
				"--sync-cert=/etc/socklane/sync/$(NODE_NAME).pem", "--sync-map=/sys/fs/bpf/lb/conntrack,changes=/sys/fs/bpf/lb,mode=active-standby",
				"--sync-lease=kube-system/lb-pair"} {
				if !strings.Contains(joined, want) {
					t.Errorf("chart with sync: agent args %v lack %s", args, want)
				}
			}
			roles := 0
			for _, o := range objs {
				if r, ok := o.(*rbacv1.Role); ok && r.Namespace == "kube-system" && len(r.Rules) == 2 {
					roles++
				}
			}
			if roles != 1 {
				t.Errorf("chart with sync: no Role for pods and leases in the release namespace")
			}
		} else if strings.Contains(joined, "--sync-") {
			t.Errorf("chart with %v: sync args %v without sync.enabled", set, args)
		}
		if strings.Contains(joined, "--kube-services") != (set["kubeServices"] != false) || strings.Contains(joined, "--pod-selector=app=web") != (set["podSelector"] != nil) ||
			strings.Contains(joined, "--kube-pod-selector=app=web") != (set["kubePodSelector"] != nil) ||
			strings.Contains(joined, "--kube-policies") != (set["kubePolicies"] == true) {
			t.Errorf("chart with %v: agent args %v", set, args)
		}
	}

	// Least privilege: create the RBAC objects for real and ask the API
	// server what the agent's account may do.
	ctx := context.Background()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.ServiceAccount:
			_, err = api.Client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = api.Client.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = api.Client.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	user := "system:serviceaccount:kube-system:socklane"
	for _, tc := range []struct {
		group, resource, verb string
		allowed               bool
	}{
		{"", "services", "list", true}, {"", "services", "watch", true}, {"", "services", "get", true},
		{"discovery.k8s.io", "endpointslices", "watch", true}, {"discovery.k8s.io", "endpointslices", "list", true},
		{"", "services", "create", false}, {"", "services", "delete", false}, {"", "secrets", "get", false},
		{"", "nodes", "list", true}, {"", "nodes", "watch", true},
		{"", "pods", "list", false}, {"", "nodes", "update", false}, {"discovery.k8s.io", "endpointslices", "update", false},
	} {
		review := func() *authv1.SubjectAccessReview {
			r, err := api.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authv1.SubjectAccessReview{Spec: authv1.SubjectAccessReviewSpec{
				User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system"},
				ResourceAttributes: &authv1.ResourceAttributes{Group: tc.group, Resource: tc.resource, Verb: tc.verb},
			}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		// The authorizer sees new RBAC objects through its informers, a
		// moment after they are created: the grants (listed first) are
		// waited for, the refusals are then checked against a synced cache.
		r := review()
		for deadline := time.Now().Add(10 * time.Second); tc.allowed && !r.Status.Allowed && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
			r = review()
		}
		if r.Status.Allowed != tc.allowed {
			t.Errorf("%s %s/%s: allowed %v, want %v", tc.verb, tc.group, tc.resource, r.Status.Allowed, tc.allowed)
		}
	}
}

// TestKubeServices: Services and EndpointSlices created in a real API
// server reach the datapath; a pod connects to the ClusterIP and reaches a
// backend; an EndpointSlice update moves traffic and destroys the sockets
// of the removed backend; deleting the Service stops new connects.
func TestKubeServices(t *testing.T) {
	api := testutil.StartAPIServer(t)
	lb := newLBBed(t)
	be0, be1 := lb.back[0], lb.back[1]
	var logs lockedBuffer
	agent := startAgent(t, lb, &logs, "--kube-services", "--kubeconfig", api.Kubeconfig, "-v")
	_ = agent
	ctx := context.Background()
	created := time.Now()
	_, err := api.Client.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "who"},
		Spec: corev1.ServiceSpec{ClusterIP: "198.19.0.10", Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slice := func(ips ...string) *discoveryv1.EndpointSlice {
		es := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "who-1", Labels: map[string]string{discoveryv1.LabelServiceName: "who"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr[int32](8080), Protocol: ptr(corev1.ProtocolTCP)}},
		}
		for _, ip := range ips {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}})
		}
		return es
	}
	if _, err := api.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, slice(be0.IPv4.String(), be1.IPv4.String()), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForLog(t, &logs, func() bool { return strings.Contains(lb.in.MustRun("svc", "list"), "default/who") })
	t.Logf("Service and EndpointSlice created to programmed (agent started with them): %s", time.Since(created))
	r := lb.probe(t, lb.client, "tcp", "198.19.0.10:80", 40)
	if r.Replies["be0"] == 0 || r.Replies["be1"] == 0 || r.Replies["be0"]+r.Replies["be1"] != 40 {
		t.Fatalf("through the ClusterIP: %v %v", r.Replies, r.Errors)
	}

	h := startHold(t, lb.in, lb.client, 12, "--mode", "tcp", "198.19.0.10:80")
	updated := time.Now()
	if _, err := api.Client.DiscoveryV1().EndpointSlices("default").Update(ctx, slice(be1.IPv4.String()), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	closed := h.closed(t, len(h.on("be0")), 300*time.Millisecond)
	for _, i := range h.on("be0") {
		if closed[i] != "ECONNABORTED" {
			t.Errorf("socket %d on the removed backend: %q, want ECONNABORTED", i, closed[i])
		}
	}
	for i := range closed {
		if h.backend[i] != "be0" {
			t.Errorf("socket %d on be1 closed", i)
		}
	}
	if r := lb.probe(t, lb.client, "tcp", "198.19.0.10:80", 20); r.Replies["be1"] != 20 {
		t.Errorf("after the update: %v %v", r.Replies, r.Errors)
	}
	t.Logf("EndpointSlice update to stale sockets destroyed: %s", time.Since(updated))

	if err := api.Client.CoreV1().Services("default").Delete(ctx, "who", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForLog(t, &logs, func() bool { return !strings.Contains(lb.in.MustRun("svc", "list"), "default/who") })
	// The VIP is nobody's address once its Service is gone.
	routeVIPsNowhere(t, lb.client)
	if r := lb.probe(t, lb.client, "tcp", "198.19.0.10:80", 1); len(r.Errors) == 0 || len(r.Replies) != 0 {
		t.Errorf("a connect to a deleted Service's ClusterIP: %v %v", r.Replies, r.Errors)
	}
	if !strings.Contains(logs.String(), "kubernetes services applied") || !strings.Contains(logs.String(), "latency=") {
		t.Errorf("agent log lacks the programming latency:\n%s", logs.String())
	}
	// The first apply is whole; the endpoint change and the deletion
	// each build their one Service and are applied as an update (what
	// `svc list` read above came through the record's journal).
	whole, updates, single := 0, 0, 0
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "kubernetes services applied") {
			t.Log(l[strings.Index(l, "msg="):])
			if strings.Contains(l, " services_built=1 ") && strings.Contains(l, " changed=1 ") {
				single++
			}
		}
		if strings.Contains(l, "services programmed") {
			if strings.Contains(l, "whole=true") {
				whole++
			} else if strings.Contains(l, "whole=false") {
				updates++
			}
		}
	}
	if whole != 1 || updates < 2 || single < 2 {
		t.Errorf("%d whole applies, %d updates, %d single-service builds; want 1 whole apply then updates of one Service each", whole, updates, single)
	}
}

// TestKubeCRI: the DaemonSet's job on one node. The agent watches the
// API server's pods of its node, attaches to those whose labels match
// (found in the runtime by UID) and serves the API server's Services: a
// CRI pod connects to a ClusterIP and reaches the backend pod, and the
// connection, both ends being on this node, is bypassed. A pod deleted
// from the API server is detached.
func TestKubeCRI(t *testing.T) {
	api := testutil.StartAPIServer(t)
	rt := testutil.StartContainerd(t)
	in := testutil.NewInstance(t)
	ctx := context.Background()
	// The API server's pods; the runtime's sandboxes carry their UIDs, as
	// the kubelet would make them.
	apiPod := func(name, app, node string) string {
		p, err := api.Client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": app}},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: testutil.PeerImage}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return string(p.UID)
	}
	rt.RunPodUID("default", "server", apiPod("server", "web", "node-1"), map[string]string{"app": "web"}, testutil.ContainerSpec{Name: "echo", Args: []string{"peer", "echo", "0.0.0.0:7000"}})
	rt.RunPodUID("default", "client", apiPod("client", "web", "node-1"), map[string]string{"app": "web"}, testutil.ContainerSpec{Name: "shell", Args: []string{"peer", "pause"}})
	rt.RunPodUID("default", "other", apiPod("other", "other", "node-1"), map[string]string{"app": "web"}, testutil.ContainerSpec{Name: "shell", Args: []string{"peer", "pause"}})
	rt.RunPodUID("default", "elsewhere", apiPod("elsewhere", "web", "node-2"), map[string]string{"app": "web"}, testutil.ContainerSpec{Name: "shell", Args: []string{"peer", "pause"}})
	// A meshed pod: labelled out of connect-time balancing.
	rt.RunPodUID("default", "meshed", apiPod("meshed", "web", "node-1"), map[string]string{"app": "web", node.OptOutLabel: "off"}, testutil.ContainerSpec{Name: "shell", Args: []string{"peer", "pause"}})
	// A pod whose program the bypass cannot serve (a splicing proxy):
	// labelled out of the bypass.
	rt.RunPodUID("default", "spliced", apiPod("spliced", "web", "node-1"), map[string]string{"app": "web", node.BypassOptOutLabel: "off"}, testutil.ContainerSpec{Name: "shell", Args: []string{"peer", "pause"}})
	pods := criPods(t, rt)
	server, client := pods["default/server"], pods["default/client"]
	var logs lockedBuffer
	agent := exec.Command(in.Bin, "--name", in.Name, "agent", "--kube-pod-selector", "app=web", "--node-name", "node-1",
		"--cri-socket", rt.Socket, "--pod-interval", "200ms", "--kube-services", "--kubeconfig", api.Kubeconfig, "--metrics-address", "")
	agent.Stdout, agent.Stderr = &logs, &logs
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = agent.Process.Kill(); _ = agent.Wait() })
	if _, err := api.Client.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: corev1.ServiceSpec{ClusterIP: "198.19.0.20", Ports: []corev1.ServicePort{
			{Name: "echo", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("echo")},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "echo-1", Labels: map[string]string{discoveryv1.LabelServiceName: "echo"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("echo"), Port: ptr[int32](7000), Protocol: ptr(corev1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{server.IP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForLog(t, &logs, func() bool {
		m := managedPods(t, in, rt.Socket)
		return m["default/server"] && m["default/client"] && strings.Contains(in.MustRun("svc", "list"), "default/echo")
	})
	// Labels in the runtime do not count: the API server's do, and the node.
	if m := managedPods(t, in, rt.Socket); m["default/other"] || m["default/elsewhere"] {
		t.Errorf("pods attached that the API server's labels or node exclude: %v", m)
	}
	before, lbBefore := in.Counters(), lbCountersOf(t, in)
	out, err := rt.Exec(client.Containers[0].ID, 30*time.Second, "/socklane", "peer", "pingpong", "198.19.0.20:80", "--size", "100", "--count", "200", "--warmup", "0")
	if err != nil {
		t.Fatalf("pingpong to the ClusterIP from a CRI pod: %v: %s", err, out)
	}
	mustEqual(t, testutil.Delta(before, in.Counters()), "conns_bypassed", 1)
	mustAtLeast(t, testutil.Delta(lbBefore, lbCountersOf(t, in)), "selected", 1)

	// The meshed pod is attached, and its connects to the ClusterIP are
	// left untranslated (to kube-proxy, absent here: nothing answers).
	waitForLog(t, &logs, func() bool { return strings.Contains(logs.String(), "pod opted out of connect-time service balancing") })
	var optouts struct {
		Netns []uint64 `json:"netns"`
	}
	if err := json.Unmarshal([]byte(in.MustRun("svc", "optout", "-o", "json")), &optouts); err != nil || len(optouts.Netns) != 1 {
		t.Errorf("svc optout: %+v %v, want the meshed pod's namespace", optouts, err)
	}
	// What is not translated fails at once, never leaving the machine.
	if out, err := exec.Command("nsenter", fmt.Sprintf("--net=/proc/%d/ns/net", pods["default/meshed"].PID), "ip", "route", "add", "unreachable", "198.19.0.0/16").CombinedOutput(); err != nil {
		t.Fatalf("routing the meshed pod's service range nowhere: %v: %s", err, out)
	}
	lbBefore = lbCountersOf(t, in)
	if out, err := rt.Exec(pods["default/meshed"].Containers[0].ID, 5*time.Second, "/socklane", "peer", "pingpong", "198.19.0.20:80", "--count", "1", "--warmup", "0"); err == nil {
		t.Errorf("the meshed pod reached the ClusterIP through socklane: %s", out)
	}
	d := testutil.Delta(lbBefore, lbCountersOf(t, in))
	mustAtLeast(t, d, "out_of_scope", 1)
	mustEqual(t, d, "selected", 0)

	// The spliced pod's connections stay on TCP; its services are balanced.
	waitForLog(t, &logs, func() bool { return strings.Contains(logs.String(), "pod opted out of the bypass") })
	if err := json.Unmarshal([]byte(in.MustRun("bypass", "optout", "-o", "json")), &optouts); err != nil || len(optouts.Netns) != 1 {
		t.Errorf("bypass optout: %+v %v, want the spliced pod's namespace", optouts, err)
	}
	before, lbBefore = in.Counters(), lbCountersOf(t, in)
	if out, err := rt.Exec(pods["default/spliced"].Containers[0].ID, 30*time.Second, "/socklane", "peer", "pingpong", "198.19.0.20:80", "--count", "200", "--warmup", "0"); err != nil {
		t.Fatalf("pingpong to the ClusterIP from the pod kept out of the bypass: %v: %s", err, out)
	}
	d = testutil.Delta(before, in.Counters())
	mustEqual(t, d, "fallback_opted_out", 1)
	mustEqual(t, d, "conns_bypassed", 0)
	mustAtLeast(t, testutil.Delta(lbBefore, lbCountersOf(t, in)), "selected", 1)

	if err := api.Client.CoreV1().Pods("default").Delete(ctx, "client", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForLog(t, &logs, func() bool { return !managedPods(t, in, rt.Socket)["default/client"] })
}

func lbCountersOf(t *testing.T, in *testutil.Instance) map[string]uint64 {
	t.Helper()
	var st struct {
		Counters map[string]uint64 `json:"counters"`
	}
	if err := json.Unmarshal([]byte(in.MustRun("svc", "list", "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	return st.Counters
}

// clusterRoleGrants says whether a ClusterRole of objs grants verb on
// resource (core group).
func clusterRoleGrants(objs []runtime.Object, resource, verb string) bool {
	for _, o := range objs {
		r, ok := o.(*rbacv1.ClusterRole)
		if !ok {
			continue
		}
		for _, rule := range r.Rules {
			if slices.Contains(rule.APIGroups, "") && slices.Contains(rule.Resources, resource) && slices.Contains(rule.Verbs, verb) {
				return true
			}
		}
	}
	return false
}
