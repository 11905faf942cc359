package certstest

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
)

// CrossSign writes, to a new directory in Istio's cacerts layout, a CA
// that signs with the root in newDir's key but whose ca-cert.pem is that
// root cross-signed by the root in oldDir: same subject, key and
// extensions, issued by the old root. Both directories hold a self-signed
// root in cacerts layout (as certs/localca writes one). root-cert.pem
// lists the old root then the new one; cert-chain.pem is the cross
// certificate, so a leaf it signs verifies to either root.
//
// This is how a root rotation stays verifiable by peers that trust only
// the old root, for tests of it.
func CrossSign(t testing.TB, oldDir, newDir string) string {
	t.Helper()
	oldRoot, oldKey := readCA(t, oldDir)
	newRoot, newKey := readCA(t, newDir)
	tmpl := *newRoot
	tmpl.Raw, tmpl.RawTBSCertificate, tmpl.Signature = nil, nil, nil
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, oldRoot, newKey.Public(), oldKey)
	if err != nil {
		t.Fatalf("certstest: cross-sign: %v", err)
	}
	cross := pemCert(der)
	keyPEM, err := os.ReadFile(filepath.Join(newDir, "ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string][]byte{
		"ca-cert.pem":    cross,
		"ca-key.pem":     keyPEM,
		"cert-chain.pem": cross,
		"root-cert.pem":  append(pemCert(oldRoot.Raw), pemCert(newRoot.Raw)...),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// readCA reads the signing certificate and key of a cacerts directory.
func readCA(t testing.TB, dir string) (*x509.Certificate, crypto.Signer) {
	t.Helper()
	certPEM, err := os.ReadFile(filepath.Join(dir, "ca-cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(certPEM)
	if b == nil {
		t.Fatalf("certstest: %s/ca-cert.pem is not PEM", dir)
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ = pem.Decode(keyPEM); b == nil {
		t.Fatalf("certstest: %s/ca-key.pem is not PEM", dir)
	}
	key, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		t.Fatalf("certstest: %s/ca-key.pem: %v", dir, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		t.Fatalf("certstest: %s/ca-key.pem: %T is not a signer", dir, key)
	}
	return cert, signer
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
