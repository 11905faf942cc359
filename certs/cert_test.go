package certs_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/certstest"
	"github.com/gozt/gozt/certs/identity"
)

func TestNewCertRejects(t *testing.T) {
	ca, otherCA := newCA(t), newCA(t)
	good := issue(t, ca, idA)
	key := newKey(t)
	sign := func(signer interface {
		IssueWithTemplate(context.Context, crypto.Signer, *x509.Certificate) (*x509.Certificate, error)
	}, tmpl *x509.Certificate) []*x509.Certificate {
		t.Helper()
		c, err := signer.IssueWithTemplate(context.Background(), key, tmpl)
		if err != nil {
			t.Fatal(err)
		}
		return []*x509.Certificate{c}
	}
	expired := certstest.LeafTemplate(t, idA.String())
	expired.NotBefore, expired.NotAfter = time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)
	caLeaf := certstest.LeafTemplate(t, idA.String())
	caLeaf.IsCA, caLeaf.KeyUsage = true, x509.KeyUsageCertSign|x509.KeyUsageDigitalSignature

	tests := []struct {
		name    string
		id      identity.Identity
		chain   []*x509.Certificate
		key     crypto.Signer
		roots   []*x509.Certificate
		wantErr error
	}{
		{"empty chain", idA, nil, good.Key, ca.Roots(), certs.ErrEmptyChain},
		{"no roots", idA, good.Chain(), good.Key, nil, certs.ErrNoRoots},
		{"key mismatch", idA, good.Chain(), key, ca.Roots(), certs.ErrKeyMismatch},
		{"nil key", idA, good.Chain(), nil, ca.Roots(), certs.ErrKeyMismatch},
		{"zero identity", identity.Identity{}, good.Chain(), good.Key, ca.Roots(), certs.ErrIdentityMismatch},
		{"other identity", idA, sign(ca, certstest.LeafTemplate(t, idB.String())), key, ca.Roots(), certs.ErrIdentityMismatch},
		{"two URI SANs", idA, sign(ca, certstest.LeafTemplate(t, idA.String(), idB.String())), key, ca.Roots(), certs.ErrIdentityMismatch},
		{"no URI SAN", idA, sign(ca, certstest.LeafTemplate(t)), key, ca.Roots(), certs.ErrIdentityMismatch},
		{"other CA", idA, sign(otherCA, certstest.LeafTemplate(t, idA.String())), key, ca.Roots(), certs.ErrUntrusted},
		{"expired", idA, sign(ca, expired), key, ca.Roots(), certs.ErrUntrusted},
		{"CA leaf", idA, sign(ca, caLeaf), key, ca.Roots(), certs.ErrBadLeaf},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := certs.NewCert(tt.id, tt.chain, tt.key, tt.roots)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("NewCert = %v, %v; want error %v", c, err, tt.wantErr)
			}
		})
	}
}

func TestNewCertAccepts(t *testing.T) {
	ca := newCA(t)
	issued := issue(t, ca, idA)
	// Root rotation: several roots, only one of which signed the chain.
	roots := append(newCA(t).Roots(), ca.Roots()...)
	chain := issued.Chain()
	leaf := chain[0]
	c, err := certs.NewCert(idA, chain, issued.Key, roots)
	if err != nil {
		t.Fatalf("NewCert: %v", err)
	}
	tc := c.TLSCertificate()
	if len(tc.Certificate) != 1 || string(tc.Certificate[0]) != string(leaf.Raw) || tc.Leaf != nil || tc.PrivateKey != issued.Key {
		t.Errorf("TLSCertificate() = %+v, not the chain and key", tc)
	}
	if c.TLSCertificate() != tc {
		t.Errorf("TLSCertificate() is rebuilt on each call")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: c.RootPool()}); err != nil {
		t.Errorf("leaf does not verify against RootPool(): %v", err)
	}
	if !c.NotBefore().Equal(leaf.NotBefore) || !c.NotAfter().Equal(leaf.NotAfter) {
		t.Errorf("NotBefore/NotAfter = %v/%v, want %v/%v", c.NotBefore(), c.NotAfter(), leaf.NotBefore, leaf.NotAfter)
	}
	want := leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) / 2)
	if !c.RefreshTime().Equal(want) {
		t.Errorf("RefreshTime() = %v, want %v", c.RefreshTime(), want)
	}
	// The Cert keeps its own copies of the slices.
	roots[0] = nil
	if c.Roots[0] == nil {
		t.Errorf("NewCert aliases the caller's roots slice")
	}
}

// TestCertHoldsNoParsedLeaf: a Cert keeps its chain as DER only, so the
// parsed certificates NewCert was given are collected once the caller drops
// them (about 2.8 KB per identity on a node), and Chain parses the same
// certificates again.
func TestCertHoldsNoParsedLeaf(t *testing.T) {
	issued := issue(t, newCA(t), idA)
	chain := issued.Chain()
	want := chain[0].Raw
	collected := make(chan struct{})
	runtime.AddCleanup(chain[0], func(ch chan struct{}) { close(ch) }, collected)
	c, err := certs.NewCert(idA, chain, issued.Key, issued.Roots)
	if err != nil {
		t.Fatal(err)
	}
	chain = nil
	// Cleanups run on their own goroutine after the collection that found
	// the object unreachable: collect until it has run, for at most 100.
	for i := 0; !isClosed(collected); i++ {
		if i == 100 {
			t.Fatal("the parsed leaf given to NewCert is still reachable from the Cert")
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	got := c.Chain()
	if len(got) != 1 || !bytes.Equal(got[0].Raw, want) || !got[0].NotAfter.Equal(c.NotAfter()) {
		t.Errorf("Chain() = %d certificates, not the leaf NewCert was given", len(got))
	}
	runtime.KeepAlive(c)
}

// isClosed reports whether ch is closed.
func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestOwnTrustIsBuiltOnFirstUse: a Cert a Manager hands out verifies peers
// against the Manager's roots and never builds a pool of its own roots; a
// Cert no Manager handed out builds it when first asked, and a copy of it
// shares the one built.
func TestOwnTrustIsBuiltOnFirstUse(t *testing.T) {
	ca := newCA(t)
	c := issue(t, ca, idA)
	m := certs.NewManager(certs.ManagerConfig{Issuer: fixedIssuer{c}})
	got, err := m.Get(t.Context(), idA)
	if err != nil {
		t.Fatal(err)
	}
	leaf := got.Chain()[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: got.RootPool()}); err != nil {
		t.Fatalf("leaf does not verify against the Manager's roots: %v", err)
	}
	if certs.OwnTrustBuiltForTest(got) || certs.OwnTrustBuiltForTest(c) {
		t.Fatal("a Manager's Cert built a pool of its own roots")
	}
	pool := c.RootPool()
	if !certs.OwnTrustBuiltForTest(c) {
		t.Fatal("RootPool of a Cert no Manager handed out built no pool")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool}); err != nil {
		t.Errorf("leaf does not verify against its own roots: %v", err)
	}
	if cp := c.WithCRL(nil); cp.RootPool() != pool {
		t.Error("a copy of the Cert built its own pool again")
	}
}
