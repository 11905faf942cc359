package localca

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
)

var testID = identity.Identity{TrustDomain: "cluster.local", Namespace: "ns", ServiceAccount: "sa"}

func mustNew(t testing.TB, cfg Config) *CA {
	t.Helper()
	ca, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return ca
}

func TestIssue(t *testing.T) {
	ca := mustNew(t, Config{TTL: time.Hour})
	c, err := ca.Issue(t.Context(), testID)
	if err != nil {
		t.Fatalf("Issue: %v", err)
	}
	// The result must be acceptable to NewCert on its own.
	chain := c.Chain()
	if _, err := certs.NewCert(testID, chain, c.Key, ca.Roots()); err != nil {
		t.Fatalf("NewCert(Issue result): %v", err)
	}
	if len(chain) != 1 {
		t.Errorf("len(Chain) = %d, want 1 for a root-signed leaf", len(chain))
	}
	leaf := chain[0]
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != testID.String() {
		t.Errorf("leaf URIs = %v, want [%v]", leaf.URIs, testID)
	}
	if len(leaf.DNSNames)+len(leaf.IPAddresses)+len(leaf.EmailAddresses) != 0 {
		t.Errorf("leaf has non-URI SANs")
	}
	if leaf.KeyUsage != x509.KeyUsageDigitalSignature {
		t.Errorf("KeyUsage = %v, want digitalSignature", leaf.KeyUsage)
	}
	if diff := cmp.Diff([]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, leaf.ExtKeyUsage); diff != "" {
		t.Errorf("ExtKeyUsage (-want +got):\n%s", diff)
	}
	if leaf.IsCA {
		t.Errorf("leaf IsCA = true")
	}
	if len(leaf.Subject.Names) != 0 {
		t.Errorf("leaf subject = %v, want empty", leaf.Subject)
	}
	// With an empty subject the SAN extension must be critical (RFC 5280
	// §4.2.1.6).
	for _, ext := range leaf.Extensions {
		if ext.Id.String() == "2.5.29.17" && !ext.Critical {
			t.Errorf("subjectAltName not critical")
		}
	}
	if k, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("leaf key is %T, want ECDSA P-256", leaf.PublicKey)
	}
	if got := leaf.NotAfter.Sub(leaf.NotBefore); got != time.Hour+backdate {
		t.Errorf("validity = %v, want %v", got, time.Hour+backdate)
	}
	// Each Issue makes a fresh key.
	c2, err := ca.Issue(t.Context(), testID)
	if err != nil {
		t.Fatalf("Issue: %v", err)
	}
	if c2.Key.Public().(*ecdsa.PublicKey).Equal(c.Key.Public()) {
		t.Errorf("two Issue calls returned the same key")
	}
}

func TestIssueDefaultTTLAndCap(t *testing.T) {
	ca := mustNew(t, Config{})
	c, err := ca.Issue(t.Context(), testID)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.NotAfter().Sub(c.NotBefore()); got != defaultTTL+backdate {
		t.Errorf("default validity = %v, want %v", got, defaultTTL+backdate)
	}
	long := mustNew(t, Config{TTL: 100 * 365 * 24 * time.Hour})
	c, err = long.Issue(t.Context(), testID)
	if err != nil {
		t.Fatal(err)
	}
	if !c.NotAfter().Equal(long.Roots()[0].NotAfter) {
		t.Errorf("NotAfter = %v, want capped at root expiry %v", c.NotAfter(), long.Roots()[0].NotAfter)
	}
}

func TestIssueErrors(t *testing.T) {
	ca := mustNew(t, Config{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := ca.Issue(ctx, testID); !errors.Is(err, context.Canceled) {
		t.Errorf("Issue(cancelled) = %v, want context.Canceled", err)
	}
	for _, id := range []identity.Identity{{}, {TrustDomain: "TD", Namespace: "a", ServiceAccount: "b"}, {TrustDomain: "td", Namespace: "a/b", ServiceAccount: "c"}} {
		if _, err := ca.Issue(t.Context(), id); err == nil {
			t.Errorf("Issue(%+v) succeeded, want error", id)
		}
	}
}

func TestDirRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cacerts")
	ca1 := mustNew(t, Config{Dir: dir})
	for _, n := range []string{fileCACert, fileCAKey, fileRootCert, fileCertChain} {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			t.Errorf("%s not written: %v", n, err)
		}
	}
	st, err := os.Stat(filepath.Join(dir, fileCAKey))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("%s mode = %v, want 0600", fileCAKey, st.Mode().Perm())
	}
	ca2 := mustNew(t, Config{Dir: dir})
	if string(ca1.RootPEM()) != string(ca2.RootPEM()) {
		t.Fatalf("reloaded CA has a different root")
	}
	onDisk, err := os.ReadFile(filepath.Join(dir, fileRootCert))
	if err != nil {
		t.Fatal(err)
	}
	if string(onDisk) != string(ca1.RootPEM()) {
		t.Errorf("root-cert.pem differs from RootPEM()")
	}
	// A leaf from the reloaded CA verifies with nothing but root-cert.pem.
	c, err := ca2.Issue(t.Context(), testID)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(onDisk) {
		t.Fatal("root-cert.pem: no certificates")
	}
	if _, err := c.Chain()[0].Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("leaf does not verify against root-cert.pem: %v", err)
	}
	verifyWithOpenSSL(t, filepath.Join(dir, fileRootCert), nil, c)
}

// verifyWithOpenSSL checks the leaf with an independent implementation
// when the openssl binary is installed.
func verifyWithOpenSSL(t *testing.T, rootFile string, untrusted []*x509.Certificate, c *certs.Cert) {
	t.Helper()
	bin, err := exec.LookPath("openssl")
	if err != nil {
		t.Log("openssl not installed; skipping independent verification")
		return
	}
	dir := t.TempDir()
	leafFile := filepath.Join(dir, "leaf.pem")
	if err := os.WriteFile(leafFile, encodeCerts(c.Chain()[:1]), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"verify", "-CAfile", rootFile}
	if len(untrusted) > 0 {
		f := filepath.Join(dir, "untrusted.pem")
		if err := os.WriteFile(f, encodeCerts(untrusted), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-untrusted", f)
	}
	out, err := exec.Command(bin, append(args, leafFile)...).CombinedOutput()
	if err != nil {
		t.Errorf("openssl verify: %v\n%s", err, out)
	}
}

// writeIntermediateLayout writes an Istio cacerts layout whose ca-cert.pem
// is an intermediate under a separate root, and returns root and
// intermediate.
func writeIntermediateLayout(t *testing.T, dir string) (root, inter *x509.Certificate) {
	t.Helper()
	rootCA := mustNew(t, Config{})
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	inter, err = rootCA.IssueWithTemplate(t.Context(), key, &x509.Certificate{
		Subject:               pkix.Name{CommonName: "intermediate"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	})
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	root = rootCA.Roots()[0]
	files := map[string][]byte{
		fileCACert:    encodeCerts([]*x509.Certificate{inter}),
		fileCAKey:     pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		fileRootCert:  encodeCerts([]*x509.Certificate{root}),
		fileCertChain: encodeCerts([]*x509.Certificate{inter, root}),
	}
	for n, data := range files {
		if err := os.WriteFile(filepath.Join(dir, n), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return root, inter
}

func TestDirIntermediate(t *testing.T) {
	dir := t.TempDir()
	root, inter := writeIntermediateLayout(t, dir)
	ca := mustNew(t, Config{Dir: dir})
	if diff := cmp.Diff([][]byte{root.Raw}, rawOf(ca.Roots())); diff != "" {
		t.Errorf("Roots() (-want +got):\n%s", diff)
	}
	c, err := ca.Issue(t.Context(), testID)
	if err != nil {
		t.Fatal(err)
	}
	// Served chain: leaf, intermediate; never the root.
	chain := c.Chain()
	leaf := chain[0]
	if diff := cmp.Diff([][]byte{leaf.Raw, inter.Raw}, rawOf(chain)); diff != "" {
		t.Errorf("Chain (-want +got):\n%s", diff)
	}
	if err := leaf.CheckSignatureFrom(inter); err != nil {
		t.Errorf("leaf not signed by the intermediate: %v", err)
	}
	// The leaf alone does not verify to the root: the intermediate is needed.
	pool := x509.NewCertPool()
	pool.AddCert(root)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool}); err == nil {
		t.Errorf("leaf verified without its intermediate")
	}
	verifyWithOpenSSL(t, filepath.Join(dir, fileRootCert), []*x509.Certificate{inter}, c)
}

func TestDirWithoutCertChain(t *testing.T) {
	dir := t.TempDir()
	_, inter := writeIntermediateLayout(t, dir)
	if err := os.Remove(filepath.Join(dir, fileCertChain)); err != nil {
		t.Fatal(err)
	}
	ca := mustNew(t, Config{Dir: dir})
	if diff := cmp.Diff([][]byte{inter.Raw}, rawOf(ca.Intermediates())); diff != "" {
		t.Errorf("Intermediates() (-want +got):\n%s", diff)
	}
}

func TestDirErrors(t *testing.T) {
	t.Run("partial layout", func(t *testing.T) {
		dir := t.TempDir()
		writeIntermediateLayout(t, dir)
		if err := os.Remove(filepath.Join(dir, fileCAKey)); err != nil {
			t.Fatal(err)
		}
		if _, err := New(Config{Dir: dir}); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("New(no key) = %v, want not-exist error", err)
		}
		if _, err := os.Stat(filepath.Join(dir, fileCAKey)); err == nil {
			t.Errorf("partial layout was overwritten")
		}
	})
	t.Run("key mismatch", func(t *testing.T) {
		dir := t.TempDir()
		writeIntermediateLayout(t, dir)
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		der, _ := x509.MarshalPKCS8PrivateKey(key)
		if err := os.WriteFile(filepath.Join(dir, fileCAKey), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := New(Config{Dir: dir}); err == nil {
			t.Errorf("New(mismatched key) succeeded")
		}
	})
	t.Run("wrong root", func(t *testing.T) {
		dir := t.TempDir()
		writeIntermediateLayout(t, dir)
		stranger := mustNew(t, Config{})
		if err := os.WriteFile(filepath.Join(dir, fileRootCert), stranger.RootPEM(), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(dir, fileCertChain)); err != nil {
			t.Fatal(err)
		}
		if _, err := New(Config{Dir: dir}); err == nil {
			t.Errorf("New(ca-cert not under root-cert) succeeded")
		}
	})
	t.Run("garbage", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, fileCACert), []byte("not pem"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := New(Config{Dir: dir}); err == nil {
			t.Errorf("New(garbage) succeeded")
		}
	})
}

func rawOf(cs []*x509.Certificate) [][]byte {
	out := make([][]byte, len(cs))
	for i, c := range cs {
		out[i] = c.Raw
	}
	return out
}
