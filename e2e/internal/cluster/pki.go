package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the cluster's certificate authority and the files made from it.
type pki struct {
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

// client identities: file name, user, groups.
var clientCerts = []struct{ name, user, group string }{
	{"admin", "e2e-admin", "system:masters"},
	{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"},
	{"controller-manager", "system:kube-controller-manager", ""},
	{"scheduler", "system:kube-scheduler", ""},
	{"kube-proxy", "system:kube-proxy", ""},
	{"kubelet", "system:node:" + NodeName, "system:nodes"},
}

// writePKI makes the CA, the API server's serving certificate, a client
// certificate and kubeconfig per component, and the service account keys.
func (c *Config) writePKI(nodeIP string) error {
	dir := pkiDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	p, err := newCA()
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, "ca.crt"), "CERTIFICATE", p.caCert.Raw); err != nil {
		return err
	}
	if err := writeKey(filepath.Join(dir, "ca.key"), p.caKey); err != nil {
		return err
	}
	ips := []net.IP{net.ParseIP(nodeIP), net.ParseIP(KubeServiceIP), net.ParseIP("127.0.0.1")}
	dns := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
		"kubernetes.default.svc." + ClusterDomain, NodeName}
	if err := p.issue(dir, "apiserver", pkix.Name{CommonName: "kube-apiserver"}, dns, ips, x509.ExtKeyUsageServerAuth); err != nil {
		return err
	}
	server := fmt.Sprintf("https://%s:%d", nodeIP, apiPort)
	for _, cc := range clientCerts {
		name := pkix.Name{CommonName: cc.user}
		if cc.group != "" {
			name.Organization = []string{cc.group}
		}
		if err := p.issue(dir, cc.name, name, nil, nil, x509.ExtKeyUsageClientAuth); err != nil {
			return err
		}
		if err := writeKubeconfig(filepath.Join(dir, cc.name+".kubeconfig"), server, dir, cc.name); err != nil {
			return err
		}
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	if err := writeKey(filepath.Join(dir, "sa.key"), saKey); err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	return writePEM(filepath.Join(dir, "sa.pub"), "PUBLIC KEY", pub)
}

func newCA() (*pki, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "gozt-e2e-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &pki{caCert: cert, caKey: key}, nil
}

// issue writes dir/name.crt and dir/name.key.
func (p *pki) issue(dir, name string, subj pkix.Name, dns []string, ips []net.IP, usage x509.ExtKeyUsage) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      subj,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		return fmt.Errorf("issue %s: %w", name, err)
	}
	if err := writePEM(filepath.Join(dir, name+".crt"), "CERTIFICATE", der); err != nil {
		return err
	}
	return writeKey(filepath.Join(dir, name+".key"), key)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// writeKubeconfig writes a kubeconfig for the client certificate name with
// the certificates embedded, so that it can be copied anywhere.
func writeKubeconfig(path, server, dir, name string) error {
	read := func(f string) (string, error) {
		b, err := os.ReadFile(filepath.Join(dir, f))
		return base64.StdEncoding.EncodeToString(b), err
	}
	ca, err := read("ca.crt")
	if err != nil {
		return err
	}
	crt, err := read(name + ".crt")
	if err != nil {
		return err
	}
	key, err := read(name + ".key")
	if err != nil {
		return err
	}
	text := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: gozt-e2e
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: gozt-e2e
  context:
    cluster: gozt-e2e
    user: %s
current-context: gozt-e2e
`, server, ca, name, crt, key, name)
	return os.WriteFile(path, []byte(text), 0o600)
}
