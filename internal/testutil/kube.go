package testutil

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// APIServer is a Kubernetes API server with its etcd, started for one
// test on 127.0.0.1.
type APIServer struct {
	Kubeconfig string
	Config     *rest.Config
	Client     kubernetes.Interface
}

func freeTCPPort(t testing.TB) int {
	t.Helper()
	return int(netip.MustParseAddrPort(FreeAddr(t)).Port())
}

func startProc(t testing.TB, log string, name string, args ...string) {
	t.Helper()
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	// Gone with the test process even if it dies without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopProcess(cmd, 10*time.Second)
		f.Close()
	})
}

// stopProcess sends SIGTERM, and SIGKILL if the process has not exited
// after grace.
func stopProcess(cmd *exec.Cmd, grace time.Duration) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
	}
}

// StartAPIServer runs etcd and kube-apiserver (built by
// scripts/k8s-binaries.sh, found through SOCKLANE_K8S_BIN) with a static
// admin token, RBAC, and service IPs in 198.19.0.0/16.
func StartAPIServer(t testing.TB) *APIServer {
	t.Helper()
	bin := os.Getenv("SOCKLANE_K8S_BIN")
	if bin == "" {
		if InCI() {
			t.Fatal("SOCKLANE_K8S_BIN is not set: run the tests with `make test` (it builds the API server with scripts/k8s-binaries.sh)")
		}
		t.Skip("no Kubernetes API server: run scripts/k8s-binaries.sh and set SOCKLANE_K8S_BIN to the directory it prints (`make test` does both)")
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			t.Fatalf("SOCKLANE_K8S_BIN=%s lacks %s: %v", bin, b, err)
		}
	}
	dir := t.TempDir()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	saKey := write("sa.key", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
	saPub := write("sa.pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))
	token := fmt.Sprintf("socklane-test-%d", time.Now().UnixNano())
	tokens := write("tokens.csv", []byte(token+",admin,admin,system:masters\n"))

	etcdPort, peerPort, apiPort := freeTCPPort(t), freeTCPPort(t), freeTCPPort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	startProc(t, filepath.Join(dir, "etcd.log"), filepath.Join(bin, "etcd"),
		"--data-dir", filepath.Join(dir, "etcd"), "--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peerPort), "--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peerPort),
		"--initial-cluster", fmt.Sprintf("default=http://127.0.0.1:%d", peerPort), "--log-level", "warn")
	startProc(t, filepath.Join(dir, "apiserver.log"), filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers", etcdURL, "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", fmt.Sprint(apiPort), "--cert-dir", filepath.Join(dir, "certs"),
		"--token-auth-file", tokens, "--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc", "--service-account-key-file", saPub,
		"--service-account-signing-key-file", saKey, "--service-cluster-ip-range", "198.19.0.0/16",
		"--disable-admission-plugins", "ServiceAccount", "--allow-privileged=true")
	kubeconfig := write("kubeconfig", []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: "https://127.0.0.1:%d", insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: %q}}]
contexts: [{name: test, context: {cluster: test, user: admin}}]
current-context: test
`, apiPort, token)))
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	deadline := started.Add(120 * time.Second)
	for {
		if _, err := cs.Discovery().ServerVersion(); err == nil {
			// The default namespace appears once the server's controllers ran.
			if _, err := cs.CoreV1().Namespaces().Get(t.Context(), "default", metav1.GetOptions{}); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "apiserver.log"))
			t.Fatalf("kube-apiserver did not come up: %s", tail(string(log), 3000))
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("kube-apiserver ready in %s", time.Since(started).Round(time.Millisecond))
	return &APIServer{Kubeconfig: kubeconfig, Config: cfg, Client: cs}
}
