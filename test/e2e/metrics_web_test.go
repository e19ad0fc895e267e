package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/socklane/socklane/internal/testutil"
)

// selfSigned writes a certificate for 127.0.0.1 and its key into dir.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "socklane-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestMetricsExposure: /metrics (every Service's names and backends) is
// not served where other pods can reach it without TLS and
// authentication; with a web configuration, only a client with the
// credentials over TLS reads it, while the probe address answers without
// them. Refused configurations leave nothing behind.
func TestMetricsExposure(t *testing.T) {
	b := testutil.Bed(t)
	in := testutil.NewInstance(t)
	pod := testutil.Pod(t, b, "p")
	dir := t.TempDir()
	_, _, pool := selfSigned(t, dir)
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	webCfg := filepath.Join(dir, "web-config.yml")
	if err := os.WriteFile(webCfg, []byte("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\nbasic_auth_users:\n  prom: "+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badCfg := filepath.Join(dir, "bad.yml")
	if err := os.WriteFile(badCfg, []byte("tls_server_config:\n  cert_file: missing.crt\n  key_file: tls.key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	agentCmd := func(extra ...string) *exec.Cmd {
		return exec.Command(in.Bin, append([]string{"--name", in.Name, "agent", "--cgroup", pod.Cgroup}, extra...)...)
	}
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"all addresses without a web config", []string{"--metrics-address", "0.0.0.0:0"}, "give --web-config-file"},
		{"a bad web config", []string{"--metrics-address", "127.0.0.1:0", "--web-config-file", badCfg}, "--web-config-file " + badCfg},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, err := agentCmd(tt.args...).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || !strings.Contains(string(out), tt.want) {
				t.Fatalf("want a refusal saying %q, got %v: %s", tt.want, err, out)
			}
			if _, err := os.Stat(filepath.Join("/sys/fs/bpf", in.Name)); err == nil {
				t.Fatalf("a refused start left a datapath pinned")
			}
		})
	}

	addr, health := testutil.FreeAddr(t), testutil.FreeAddr(t)
	var logs lockedBuffer
	agent := agentCmd("--metrics-address", addr, "--web-config-file", webCfg, "--health-address", health)
	agent.Stdout, agent.Stderr = &logs, &logs
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = agent.Process.Signal(syscall.SIGTERM); _ = agent.Wait() })
	waitFor(t, func() bool { code, _, err := httpGet("http://" + health + "/readyz"); return err == nil && code == 200 })
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	get := func(scheme, user, pass string) (int, string, error) {
		req, err := http.NewRequest("GET", scheme+"://"+addr+"/metrics", nil)
		if err != nil {
			return 0, "", err
		}
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		var sb strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			sb.Write(buf[:n])
			if err != nil {
				break
			}
		}
		return resp.StatusCode, sb.String(), nil
	}
	if code, body, err := get("http", "", ""); err == nil && code == 200 && strings.Contains(body, "socklane_") {
		t.Errorf("/metrics served over plain HTTP")
	}
	if code, _, err := get("https", "", ""); err != nil || code != http.StatusUnauthorized {
		t.Errorf("/metrics over TLS without credentials: %d %v, want 401", code, err)
	}
	if code, _, err := get("https", "prom", "wrong"); err != nil || code != http.StatusUnauthorized {
		t.Errorf("/metrics with a wrong password: %d %v, want 401", code, err)
	}
	code, body, err := get("https", "prom", "s3cret")
	if err != nil || code != 200 || !strings.Contains(body, "socklane_build_info") {
		t.Errorf("/metrics with the credentials: %d %v", code, err)
	}
	if code, body, err := httpGet("http://" + health + "/metrics"); err == nil && code == 200 && strings.Contains(body, "socklane_") {
		t.Errorf("the probe address serves /metrics")
	}
}
