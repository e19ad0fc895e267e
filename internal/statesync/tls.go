package statesync

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// tlsConfig is mutual TLS between nodes: every node presents a
// certificate whose identity (a DNS name, or the common name) is its node
// name, signed by the cluster's sync CA, and accepts only peers it lists.
// The files are read again at every handshake.
type tlsConfig struct {
	node  string
	files TLSFiles
	// refused is called with the reason whenever a peer's certificate is
	// refused.
	refused func(reason string)
}

func loadTLS(node string, f TLSFiles) (*tlsConfig, error) {
	c := &tlsConfig{node: node, files: f}
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("--sync-cert %s, --sync-key %s: %w", f.Cert, f.Key, err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("--sync-cert %s: %w", f.Cert, err)
	}
	if !slices.Contains(identities(leaf), node) {
		return nil, fmt.Errorf("--sync-cert %s names %v, not this node %s: peers would refuse it (make one for %s: socklane sync certs)", f.Cert, identities(leaf), node, node)
	}
	if _, err := c.pool(); err != nil {
		return nil, err
	}
	return c, nil
}

// identities are the node names a certificate speaks for.
func identities(c *x509.Certificate) []string {
	if len(c.DNSNames) > 0 {
		return c.DNSNames
	}
	if c.Subject.CommonName != "" {
		return []string{c.Subject.CommonName}
	}
	return nil
}

func (c *tlsConfig) pool() (*x509.CertPool, error) {
	pem, err := os.ReadFile(c.files.CA)
	if err != nil {
		return nil, fmt.Errorf("--sync-ca: %w", err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--sync-ca %s: no PEM certificate in it", c.files.CA)
	}
	return p, nil
}

func (c *tlsConfig) certificate() (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(c.files.Cert, c.files.Key)
	if err != nil {
		return nil, fmt.Errorf("reading the sync certificate: %w", err)
	}
	return &cert, nil
}

// verify checks a peer's chain against the CA and returns the peer's
// node names. want, if set, must be one of them.
func (c *tlsConfig) verify(raw [][]byte, usage x509.ExtKeyUsage, want string) ([]string, error) {
	if len(raw) == 0 {
		return nil, c.refuse("no certificate")
	}
	pool, err := c.pool()
	if err != nil {
		return nil, err
	}
	certs := make([]*x509.Certificate, 0, len(raw))
	for _, r := range raw {
		cert, err := x509.ParseCertificate(r)
		if err != nil {
			return nil, c.refuse("unreadable certificate: " + err.Error())
		}
		certs = append(certs, cert)
	}
	inter := x509.NewCertPool()
	for _, ic := range certs[1:] {
		inter.AddCert(ic)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return nil, c.refuse("certificate not signed by the sync CA: " + err.Error())
	}
	ids := identities(certs[0])
	if want != "" && !slices.Contains(ids, want) {
		return nil, c.refuse(fmt.Sprintf("certificate names %v, not the peer %s", ids, want))
	}
	return ids, nil
}

func (c *tlsConfig) refuse(reason string) error {
	if c.refused != nil {
		c.refused(reason)
	}
	return errors.New(reason)
}

// server is the listening side: a client certificate is required and
// verified here (so that a refusal is counted).
func (c *tlsConfig) server() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: tls.RequireAnyClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return c.certificate()
		},
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			_, err := c.verify(raw, x509.ExtKeyUsageClientAuth, "")
			return err
		},
	}
}

// client dials peer: its certificate must name it.
func (c *tlsConfig) client(peer string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// The chain and the peer's name are verified below, against the
		// sync CA only (not the system's roots).
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyPeerCertificate
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return c.certificate()
		},
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			_, err := c.verify(raw, x509.ExtKeyUsageServerAuth, peer)
			return err
		},
	}
}

// MakeCerts writes a new CA (ca.pem, ca-key.pem) into dir, unless one is
// there, and a certificate and key for each node (NODE.pem, NODE-key.pem)
// valid for both ends of a sync stream.
func MakeCerts(dir string, nodes []string, validity time.Duration) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("making %s: %w", dir, err)
	}
	caCert, caKey, err := loadOrMakeCA(dir, validity)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if !nodeName.MatchString(n) {
			return fmt.Errorf("node name %q: lower-case letters, digits, '-' and '.'", n)
		}
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return fmt.Errorf("making a key: %w", err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(), Subject: pkix.Name{CommonName: n}, DNSNames: []string{n},
			NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(validity),
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("signing %s: %w", n, err)
		}
		if err := writePEM(filepath.Join(dir, n+".pem"), "CERTIFICATE", der); err != nil {
			return err
		}
		kder, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return err
		}
		if err := writePEM(filepath.Join(dir, n+"-key.pem"), "PRIVATE KEY", kder); err != nil {
			return err
		}
	}
	return nil
}

func loadOrMakeCA(dir string, validity time.Duration) (*x509.Certificate, any, error) {
	certPath, keyPath := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	if pair, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil {
		cert, err := x509.ParseCertificate(pair.Certificate[0])
		return cert, pair.PrivateKey, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("making the CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "socklane sync CA"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(validity),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("making the CA: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
		return nil, nil, err
	}
	if err := writePEM(keyPath, "PRIVATE KEY", kder); err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

func writePEM(path, typ string, der []byte) error {
	b := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
