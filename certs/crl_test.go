package certs_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/certstest"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/internal/syncbuf"
)

// ca is a certificate authority of a test PKI.
type ca struct {
	cert *x509.Certificate
	key  crypto.Signer
}

// testPKI is root → intermediate → leafs, plus a leaf issued by the root
// directly, and an impostor: a CA with the intermediate's name but another
// key.
type testPKI struct {
	root, inter, impostor ca
	serial                int64
}

func newTestPKI(t testing.TB) *testPKI {
	t.Helper()
	p := &testPKI{serial: 100}
	p.root = p.newCA(t, "gozt test root", nil)
	p.inter = p.newCA(t, "gozt test intermediate", &p.root)
	p.impostor = p.newCA(t, "gozt test intermediate", nil)
	return p
}

func (p *testPKI) nextSerial() *big.Int {
	p.serial++
	return big.NewInt(p.serial)
}

// newCA makes a CA named cn, signed by parent (self-signed if nil).
func (p *testPKI) newCA(t testing.TB, cn string, parent *ca) ca {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          p.nextSerial(),
		Subject:               pkix.Name{Organization: []string{"cluster.local"}, CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, key.Public(), signerKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return ca{cert, key}
}

// issue makes a workload Cert for id: a leaf signed by issuer, served with
// the intermediate if issuer is it, trusting the root.
func (p *testPKI) issue(t testing.TB, id identity.Identity, issuer ca) *certs.Cert {
	t.Helper()
	key := newKey(t)
	tmpl := certstest.LeafTemplate(t, id.String())
	tmpl.SerialNumber = p.nextSerial()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer.cert, key.Public(), issuer.key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	chain := []*x509.Certificate{leaf}
	if issuer.cert != p.root.cert {
		chain = append(chain, issuer.cert)
	}
	c, err := certs.NewCert(id, chain, key, []*x509.Certificate{p.root.cert})
	if err != nil {
		t.Fatalf("NewCert(%v): %v", id, err)
	}
	return c
}

// crlDER is a CRL signed by by, listing serials, valid until next (which
// may be past).
func crlDER(t testing.TB, by ca, next time.Time, ext []pkix.Extension, serials ...*big.Int) []byte {
	t.Helper()
	tmpl := &x509.RevocationList{
		Number:          big.NewInt(1),
		ThisUpdate:      next.Add(-48 * time.Hour),
		NextUpdate:      next,
		ExtraExtensions: ext,
	}
	for _, s := range serials {
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries,
			x509.RevocationListEntry{SerialNumber: s, RevocationTime: time.Now().Add(-time.Minute)})
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, by.cert, by.key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func pemCRL(ders ...[]byte) []byte {
	var b bytes.Buffer
	for _, d := range ders {
		pem.Encode(&b, &pem.Block{Type: "X509 CRL", Bytes: d})
	}
	return b.Bytes()
}

var (
	tomorrow  = time.Now().Add(24 * time.Hour)
	yesterday = time.Now().Add(-24 * time.Hour)
)

func serialOf(c *certs.Cert, i int) *big.Int { return c.Chain()[i].SerialNumber }

func writeFile(t testing.TB, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(name, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func loadCRL(t testing.TB, data []byte) *certs.CRL {
	t.Helper()
	name := filepath.Join(t.TempDir(), "crl.pem")
	writeFile(t, name, data)
	l, err := certs.LoadCRL(name)
	if err != nil {
		t.Fatalf("LoadCRL: %v", err)
	}
	return l
}

// peers is one handshake's two ends: server (idB) and client (idA).
type peers struct {
	server, client *certs.Cert
}

// TestCRLHandshake runs real handshakes with ServerConfig and ClientConfig
// where the verifying side's Cert carries a CRL: the server checking the
// client (inbound), and the client checking the server (outbound).
func TestCRLHandshake(t *testing.T) {
	p := newTestPKI(t)
	underInter := peers{p.issue(t, idB, p.inter), p.issue(t, idA, p.inter)}
	underRoot := peers{p.issue(t, idB, p.root), p.issue(t, idA, p.root)}
	// crl builds the CRL file; peer is the side being checked.
	tests := []struct {
		name    string
		peers   peers
		crl     func(peer *certs.Cert) []byte
		revoked bool
	}{
		{"empty file", underInter, func(*certs.Cert) []byte { return nil }, false},
		{"nothing revoked", underInter, func(*certs.Cert) []byte {
			return pemCRL(crlDER(t, p.root, tomorrow, nil), crlDER(t, p.inter, tomorrow, nil))
		}, false},
		{"other serial revoked", underInter, func(*certs.Cert) []byte {
			return pemCRL(crlDER(t, p.inter, tomorrow, nil, big.NewInt(99999)))
		}, false},
		{"revoked leaf", underInter, func(peer *certs.Cert) []byte {
			return pemCRL(crlDER(t, p.inter, tomorrow, nil, serialOf(peer, 0)))
		}, true},
		{"revoked intermediate", underInter, func(peer *certs.Cert) []byte {
			return pemCRL(crlDER(t, p.root, tomorrow, nil, serialOf(peer, 1)))
		}, true},
		{"revoked leaf issued by the root", underRoot, func(peer *certs.Cert) []byte {
			return pemCRL(crlDER(t, p.root, tomorrow, nil, serialOf(peer, 0)))
		}, true},
		{"two CRLs in one PEM, second revokes", underInter, func(peer *certs.Cert) []byte {
			return pemCRL(crlDER(t, p.root, tomorrow, nil), crlDER(t, p.inter, tomorrow, nil, serialOf(peer, 0)))
		}, true},
		{"DER file", underInter, func(peer *certs.Cert) []byte {
			return crlDER(t, p.inter, tomorrow, nil, serialOf(peer, 0))
		}, true},
		// ztunnel (webpki ExpirationPolicy::Ignore) does not enforce NextUpdate.
		{"expired CRL still revokes", underInter, func(peer *certs.Cert) []byte {
			return pemCRL(crlDER(t, p.inter, yesterday, nil, serialOf(peer, 0)))
		}, true},
		// Same issuer name, other key: not the issuer's CRL, status unknown.
		{"impostor CRL ignored", underInter, func(peer *certs.Cert) []byte {
			return pemCRL(crlDER(t, p.impostor, tomorrow, nil, serialOf(peer, 0)))
		}, false},
		// The root lists the leaf's serial, but the leaf's issuer is the
		// intermediate: serials are per issuer.
		{"serial listed by another issuer", underInter, func(peer *certs.Cert) []byte {
			return pemCRL(crlDER(t, p.root, tomorrow, nil, serialOf(peer, 0)))
		}, false},
		{"unknown issuer", underInter, func(peer *certs.Cert) []byte {
			other := p.newCA(t, "elsewhere", nil)
			return pemCRL(crlDER(t, other, tomorrow, nil, serialOf(peer, 0)))
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name+"/inbound", func(t *testing.T) {
			crl := loadCRL(t, tt.crl(tt.peers.client))
			srv := certs.ServerConfig(serveCert(tt.peers.server.WithCRL(crl)))
			cli := certs.ClientConfig(tt.peers.client, []string{idB.String()})
			r := handshake(t, t.Context(), srv, cli)
			checkRevoked(t, r.serverErr, tt.revoked)
		})
		t.Run(tt.name+"/outbound", func(t *testing.T) {
			crl := loadCRL(t, tt.crl(tt.peers.server))
			srv := certs.ServerConfig(serveCert(tt.peers.server))
			cli := certs.ClientConfig(tt.peers.client.WithCRL(crl), []string{idB.String()})
			r := handshake(t, t.Context(), srv, cli)
			checkRevoked(t, r.clientErr, tt.revoked)
		})
	}
}

// checkRevoked checks the verifying side's handshake error: wrapping
// ErrCertRevoked (what the proxy counts in
// istio_crl_policy_rejections_total) if revoked, nil otherwise.
func checkRevoked(t testing.TB, err error, revoked bool) {
	t.Helper()
	switch {
	case revoked && !errors.Is(err, certs.ErrCertRevoked):
		t.Errorf("handshake error = %v, want %v", err, certs.ErrCertRevoked)
	case !revoked && err != nil:
		t.Errorf("handshake error = %v, want nil", err)
	}
}

func TestLoadCRLErrors(t *testing.T) {
	p := newTestPKI(t)
	good := crlDER(t, p.inter, tomorrow, nil, big.NewInt(7))
	goodPEM := string(pemCRL(good))
	tests := []struct {
		name string
		data []byte
	}{
		{"garbage", []byte("not a CRL")},
		{"truncated DER", good[:len(good)/2]},
		{"bad base64", []byte("-----BEGIN X509 CRL-----\n!!!!\n-----END X509 CRL-----\n")},
		{"missing END", []byte(goodPEM[:len(goodPEM)-20])},
		{"good then bad block", []byte(goodPEM + "-----BEGIN X509 CRL-----\n!!!!\n-----END X509 CRL-----\n")},
		{"CRL block of junk DER", pemCRL([]byte("junk"))},
		{"delta CRL", pemCRL(crlDER(t, p.inter, tomorrow, []pkix.Extension{
			{Id: asn1.ObjectIdentifier{2, 5, 29, 27}, Value: mustASN1(t, 1)}}))},
		{"unknown critical extension", pemCRL(crlDER(t, p.inter, tomorrow, []pkix.Extension{
			{Id: asn1.ObjectIdentifier{1, 2, 3, 4}, Critical: true, Value: mustASN1(t, 1)}}))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := filepath.Join(t.TempDir(), "crl.pem")
			writeFile(t, name, tt.data)
			l, err := certs.LoadCRL(name)
			if err == nil {
				t.Fatalf("LoadCRL = %v, nil; want error", l)
			}
			if msg := err.Error(); !strings.Contains(msg, "CRL_PATH") || !strings.Contains(msg, name) || strings.Contains(msg, "\n") {
				t.Errorf("LoadCRL error %q: want one line naming CRL_PATH and %s", msg, name)
			}
		})
	}
	t.Run("directory", func(t *testing.T) {
		if _, err := certs.LoadCRL(t.TempDir()); err == nil {
			t.Error("LoadCRL(directory) = nil error")
		}
	})
}

func mustASN1(t testing.TB, v any) []byte {
	t.Helper()
	b, err := asn1.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestLoadCRLCounts(t *testing.T) {
	p := newTestPKI(t)
	a := crlDER(t, p.root, tomorrow, nil, big.NewInt(1))
	b := crlDER(t, p.inter, tomorrow, nil, big.NewInt(2), big.NewInt(3))
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.root.cert.Raw})
	tests := []struct {
		name           string
		data           []byte
		lists, entries int
	}{
		{"empty", nil, 0, 0},
		{"white space", []byte("\n \n"), 0, 0},
		{"certificate only", certPEM, 0, 0},
		{"one DER", a, 1, 1},
		{"two PEM", pemCRL(a, b), 2, 3},
		{"certificate and CRL, leading blank line", append(append([]byte("\n"), certPEM...), pemCRL(b)...), 1, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := loadCRL(t, tt.data)
			if lists, entries := l.Counts(); lists != tt.lists || entries != tt.entries {
				t.Errorf("Counts() = %d, %d; want %d, %d", lists, entries, tt.lists, tt.entries)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		l, err := certs.LoadCRL(filepath.Join(t.TempDir(), "absent.pem"))
		if err != nil {
			t.Fatalf("LoadCRL(missing) error = %v, want nil (ztunnel waits for the file)", err)
		}
		if lists, _ := l.Counts(); lists != 0 {
			t.Errorf("Counts() = %d CRLs, want 0", lists)
		}
	})
}

// TestRevoked checks Revoked on verified chains and PeerRevoked on
// presented ones.
func TestRevoked(t *testing.T) {
	p := newTestPKI(t)
	revoked := p.issue(t, idA, p.inter)
	fine := p.issue(t, idB, p.inter)
	l := loadCRL(t, pemCRL(crlDER(t, p.inter, tomorrow, nil, serialOf(revoked, 0))))
	interRevoked := loadCRL(t, pemCRL(crlDER(t, p.root, tomorrow, nil, serialOf(fine, 1))))
	chain := func(c *certs.Cert) []*x509.Certificate {
		return append(append([]*x509.Certificate{}, c.Chain()...), p.root.cert)
	}
	now := time.Now()
	tests := []struct {
		name string
		got  bool
		want bool
	}{
		{"Revoked(revoked chain)", l.Revoked(chain(revoked)), true},
		{"Revoked(fine chain)", l.Revoked(chain(fine)), false},
		{"Revoked(leaf only)", l.Revoked(revoked.Chain()[:1]), false},
		{"nil CRL Revoked", (*certs.CRL)(nil).Revoked(chain(revoked)), false},
		{"PeerRevoked(revoked)", l.PeerRevoked(fine, revoked.Chain(), now), true},
		{"PeerRevoked(fine)", l.PeerRevoked(revoked, fine.Chain(), now), false},
		{"PeerRevoked(unverifiable)", l.PeerRevoked(fine, revoked.Chain()[:1], now), false},
		{"PeerRevoked(after expiry)", l.PeerRevoked(fine, revoked.Chain(), now.Add(48*time.Hour)), false},
		{"nil CRL PeerRevoked", (*certs.CRL)(nil).PeerRevoked(fine, revoked.Chain(), now), false},
		{"PeerRevoked(revoked intermediate)", interRevoked.PeerRevoked(revoked, fine.Chain(), now), true},
		{"Revoked(revoked intermediate)", interRevoked.Revoked(chain(fine)), true},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

// TestCRLReload rewrites the file under a CRL in use by handshakes: a
// revocation that loads applies to later handshakes; a bad rewrite, or
// removing the file, keeps the set; a same-size rewrite right after a
// read is seen.
func TestCRLReload(t *testing.T) {
	p := newTestPKI(t)
	server, client := p.issue(t, idB, p.inter), p.issue(t, idA, p.inter)
	name := filepath.Join(t.TempDir(), "crl.pem")
	writeFile(t, name, pemCRL(crlDER(t, p.inter, tomorrow, nil, big.NewInt(90001))))
	l, err := certs.LoadCRL(name)
	if err != nil {
		t.Fatal(err)
	}
	var logs syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	srv := certs.ServerConfig(serveCert(server.WithCRL(l)))
	cli := certs.ClientConfig(client, []string{idB.String()})
	checkRevoked(t, handshake(t, t.Context(), srv, cli).serverErr, false)

	if certs.PollForTest(l, log) {
		t.Error("poll of an unchanged file published")
	}
	// Same size and modification time as the content last read: seen
	// because that read was of a fresh file.
	fi, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	same := sameSizeCRL(t, int(fi.Size()), func() []byte {
		return pemCRL(crlDER(t, p.inter, tomorrow, nil, big.NewInt(90002)))
	})
	writeFile(t, name, same)
	if err := os.Chtimes(name, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if !certs.PollForTest(l, log) {
		t.Error("poll after a same-size rewrite did not publish")
	}
	writeFile(t, name, pemCRL(crlDER(t, p.inter, tomorrow, nil, big.NewInt(90002), serialOf(client, 0))))
	if !certs.PollForTest(l, log) {
		t.Fatal("poll after revoking the client did not publish")
	}
	checkRevoked(t, handshake(t, t.Context(), srv, cli).serverErr, true)

	for _, bad := range []func(){
		func() { writeFile(t, name, []byte("garbage")) },
		func() { os.Remove(name) },
	} {
		bad()
		for range 2 {
			if certs.PollForTest(l, log) {
				t.Error("poll of a bad file published")
			}
		}
		checkRevoked(t, handshake(t, t.Context(), srv, cli).serverErr, true)
	}
	if got := strings.Count(logs.String(), "crl reload failed"); got != 2 {
		t.Errorf("logged %d reload failures, want 2 (one per distinct failure):\n%s", got, logs.String())
	}
}

// sameSizeCRL calls gen (ECDSA signatures vary in length) until it returns
// size bytes.
func sameSizeCRL(t testing.TB, size int, gen func() []byte) []byte {
	t.Helper()
	for range 100 {
		if b := gen(); len(b) == size {
			return b
		}
	}
	t.Fatalf("no CRL of %d bytes in 100 tries", size)
	return nil
}

// TestCRLWatch runs Watch in a synctest bubble: a change that loads calls
// onChange once, after which Revoked sees it; a bad change does not.
func TestCRLWatch(t *testing.T) {
	p := newTestPKI(t)
	peer := p.issue(t, idA, p.inter)
	chain := append(append([]*x509.Certificate{}, peer.Chain()...), p.root.cert)
	name := filepath.Join(t.TempDir(), "crl.pem")
	synctest.Test(t, func(t *testing.T) {
		l, err := certs.LoadCRL(name) // missing: waits for the file
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		var changes atomic.Int32
		done := make(chan struct{})
		go func() {
			defer close(done)
			l.Watch(ctx, nil, func() { changes.Add(1) })
		}()
		step := func(write func(), wantChanges int32, wantRevoked bool) {
			t.Helper()
			write()
			time.Sleep(certs.CRLPollInterval)
			synctest.Wait()
			if got := changes.Load(); got != wantChanges || l.Revoked(chain) != wantRevoked {
				t.Errorf("after a poll: %d changes, Revoked = %v; want %d, %v", got, l.Revoked(chain), wantChanges, wantRevoked)
			}
		}
		step(func() {}, 0, false)
		step(func() { writeFile(t, name, pemCRL(crlDER(t, p.inter, tomorrow, nil, serialOf(peer, 0)))) }, 1, true)
		step(func() {}, 1, true)
		step(func() { writeFile(t, name, []byte("-----BEGIN X509 CRL-----\n")) }, 1, true)
		step(func() { writeFile(t, name, nil) }, 2, false)
		cancel()
		<-done
	})
}

func TestManagerAttachesCRL(t *testing.T) {
	p := newTestPKI(t)
	c := p.issue(t, idA, p.inter)
	l := loadCRL(t, nil)
	m := certs.NewManager(certs.ManagerConfig{Issuer: fixedIssuer{c}, CRL: l})
	got, err := m.Get(t.Context(), idA)
	if err != nil {
		t.Fatal(err)
	}
	if got.CRL() != l {
		t.Errorf("Get().CRL() = %p, want %p", got.CRL(), l)
	}
	if c.CRL() != nil {
		t.Error("the issuer's Cert was modified")
	}
}

type fixedIssuer struct{ c *certs.Cert }

func (f fixedIssuer) Issue(context.Context, identity.Identity) (*certs.Cert, error) { return f.c, nil }

// FuzzParseCRL feeds the CRL file parser arbitrary bytes: it must not
// panic, a DER (non-PEM) input that parses is one CRL, and errors are one
// line.
func FuzzParseCRL(f *testing.F) {
	p := newTestPKI(f)
	a := crlDER(f, p.root, tomorrow, nil, big.NewInt(1))
	b := crlDER(f, p.inter, yesterday, nil, big.NewInt(2), big.NewInt(3))
	for _, seed := range [][]byte{nil, []byte("garbage"), a, a[:len(a)-1], pemCRL(a), pemCRL(a, b),
		pemCRL([]byte{0x30, 0x00}), []byte("-----BEGIN X509 CRL-----\n"),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.root.cert.Raw})} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		lists, entries, err := certs.ParseCRLSetForTest(data)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error has a newline: %q", err)
			}
			return
		}
		if entries < 0 || lists < 0 {
			t.Errorf("lists, entries = %d, %d", lists, entries)
		}
		if pemLike := bytes.Contains(data, []byte("-----BEGIN")); !pemLike && len(bytes.TrimSpace(data)) > 0 && lists != 1 {
			t.Errorf("DER input parsed as %d CRLs, want 1", lists)
		}
	})
}
