package certs_test

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/certstest"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/localca"
)

var idC = identity.MustParse("spiffe://cluster.local/ns/c/sa/c")

// rotation is a CA moving from root A to root B.
type rotation struct {
	name   string
	a, b   *localca.CA         // sign with root A; then with root B
	bundle []*x509.Certificate // the root bundle answered once B signs: B only
	rootA  *x509.Certificate
	rootB  *x509.Certificate
}

// rotationKinds are the two ways a root changes: B cross-signed by A (a
// leaf of B verifies to A too, through the cross certificate the CA
// serves) and B independent of A.
var rotationKinds = []string{"cross-signed", "independent"}

// newRotation builds a rotation of kind. Call it inside the synctest
// bubble, if any, so that the roots are valid at the bubble's clock.
func newRotation(t *testing.T, kind string) rotation {
	t.Helper()
	dirA, dirB := t.TempDir(), t.TempDir()
	a := mustLocalCA(t, localca.Config{Dir: dirA, TTL: time.Hour})
	r := rotation{name: kind, a: a, rootA: a.Roots()[0]}
	if kind == "cross-signed" {
		b := mustLocalCA(t, localca.Config{Dir: dirB, TTL: time.Hour})
		r.b = mustLocalCA(t, localca.Config{Dir: certstest.CrossSign(t, dirA, dirB), TTL: time.Hour})
		r.bundle = b.Roots()
	} else {
		r.b = mustLocalCA(t, localca.Config{TTL: time.Hour})
		r.bundle = r.b.Roots()
	}
	r.rootB = r.bundle[0]
	return r
}

// eachRotation runs f in a synctest bubble for each rotation kind.
func eachRotation(t *testing.T, f func(t *testing.T, r rotation)) {
	for _, kind := range rotationKinds {
		t.Run(kind, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { f(t, newRotation(t, kind)) })
		})
	}
}

func mustLocalCA(t *testing.T, cfg localca.Config) *localca.CA {
	t.Helper()
	ca, err := localca.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// switchTo makes f sign with r's new CA and answer B's bundle.
func (r rotation) switchTo(f *fakeIssuer) {
	f.set(func(f *fakeIssuer) { f.ca, f.roots = r.b, r.bundle })
}

// peerState is what a handshake with a peer presenting chain shows
// VerifyConnection.
func peerState(chain []*x509.Certificate) *tls.ConnectionState {
	return &tls.ConnectionState{Version: tls.VersionTLS13, NegotiatedProtocol: "h2", PeerCertificates: chain}
}

// connect runs the checks of a handshake from client to server, both
// ways: the server verifying the client (inbound) and the client verifying
// the server (outbound). It returns the first failure.
func connect(client, server *certs.Cert) error {
	now := time.Now()
	if err := certs.VerifyClientForTest(server, peerState(client.Chain()), now); err != nil {
		return err
	}
	return certs.VerifyServerForTest(client, []string{server.Identity.String()}, peerState(server.Chain()), now)
}

// wantBothWays fails t unless x and y connect in both directions.
func wantBothWays(t *testing.T, step string, x, y *certs.Cert) {
	t.Helper()
	if err := connect(x, y); err != nil {
		t.Errorf("%s: %v → %v: %v", step, x.Identity, y.Identity, err)
	}
	if err := connect(y, x); err != nil {
		t.Errorf("%s: %v → %v: %v", step, y.Identity, x.Identity, err)
	}
}

// wantRefused fails t unless a peer with a leaf of hostile is refused by
// each of certs, as client and as server.
func wantRefused(t *testing.T, step string, hostile *certs.Cert, certs ...*certs.Cert) {
	t.Helper()
	for _, c := range certs {
		if err := connect(hostile, c); err == nil {
			t.Errorf("%s: %v accepted a client from an untrusted root", step, c.Identity)
		}
		if err := connect(c, hostile); err == nil {
			t.Errorf("%s: %v accepted a server from an untrusted root", step, c.Identity)
		}
	}
}

// anchoredAt reports whether c's chain verifies to root alone.
func anchoredAt(c *certs.Cert, root *x509.Certificate) bool {
	pool := x509.NewCertPool()
	pool.AddCert(root)
	inter := x509.NewCertPool()
	for _, ic := range c.Chain()[1:] {
		inter.AddCert(ic)
	}
	_, err := c.Chain()[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err == nil
}

// TestRootRotationTrustsOldAndNew (istio/ztunnel#1679): once the CA
// answers with root B, a workload still holding a leaf of root A and one
// with a leaf of B connect both ways, and a leaf of an unrelated root C
// is refused before, during and after.
func TestRootRotationTrustsOldAndNew(t *testing.T) {
	eachRotation(t, func(t *testing.T, r rotation) {
		f := &fakeIssuer{ca: r.a, ttl: time.Hour}
		m := certs.NewManager(certs.ManagerConfig{Issuer: f})
		hostile := issue(t, newCA(t), idB)
		a, c := mustGet(t, m, idA), mustGet(t, m, idC)
		wantBothWays(t, "before", a, c)
		wantRefused(t, "before", hostile, a, c)

		r.switchTo(f)
		b := mustGet(t, m, idB) // the CA's first answer with root B
		if !anchoredAt(b, r.rootB) {
			t.Fatalf("the leaf issued after the switch does not verify to root B")
		}
		wantBothWays(t, "A leaf and B leaf", a, b)
		wantBothWays(t, "A leaf and B leaf", c, b)
		wantRefused(t, "during", hostile, a, b, c)
	})
}

// TestRootRotationRefetchesAtOnce: the first answer with a new root makes
// Run fetch every other certificate again at once, from the new chain,
// instead of at half-life.
func TestRootRotationRefetchesAtOnce(t *testing.T) {
	eachRotation(t, func(t *testing.T, r rotation) {
		f := &fakeIssuer{ca: r.a, ttl: time.Hour}
		m := certs.NewManager(certs.ManagerConfig{Issuer: f})
		stop := runManager(t, m)
		defer stop()
		a, c := mustGet(t, m, idA), mustGet(t, m, idC)
		time.Sleep(time.Minute)

		r.switchTo(f)
		b := mustGet(t, m, idB)
		time.Sleep(time.Second)
		synctest.Wait()
		for _, st := range m.States() {
			if st.Cert == nil || !anchoredAt(st.Cert, r.rootB) {
				t.Errorf("a second after the CA answered with root B, %v still has a leaf of root A", st.Identity)
			}
		}
		if a2, c2 := mustGet(t, m, idA), mustGet(t, m, idC); a2 == a || c2 == c {
			t.Errorf("the certificates of A and C were not replaced")
		} else {
			wantBothWays(t, "after", a2, c2)
			wantBothWays(t, "after", a2, b)
		}
	})
}

// accepts reports whether c accepts peer's leaf both as a client (inbound)
// and as a server (outbound); peer's own view is not checked.
func accepts(c, peer *certs.Cert) bool {
	now := time.Now()
	return certs.VerifyClientForTest(c, peerState(peer.Chain()), now) == nil &&
		certs.VerifyServerForTest(c, []string{peer.Identity.String()}, peerState(peer.Chain()), now) == nil
}

// trusts reports whether c verifies peers against root.
func trusts(c *certs.Cert, root *x509.Certificate) bool {
	for _, r := range c.TrustedRoots() {
		if r.Equal(root) {
			return true
		}
	}
	return false
}

// TestRootsChangedRefetches: when the CA's root file changes
// (RootsChanged), Run fetches every certificate again at once, and the
// answers' new root is trusted beside the old one.
func TestRootsChangedRefetches(t *testing.T) {
	eachRotation(t, func(t *testing.T, r rotation) {
		f := &fakeIssuer{ca: r.a, ttl: time.Hour}
		m := certs.NewManager(certs.ManagerConfig{Issuer: f})
		stop := runManager(t, m)
		defer stop()
		a, c := mustGet(t, m, idA), mustGet(t, m, idC)
		time.Sleep(time.Minute)
		r.switchTo(f)
		m.RootsChanged()
		time.Sleep(time.Second)
		synctest.Wait()
		a2, c2 := mustGet(t, m, idA), mustGet(t, m, idC)
		if !anchoredAt(a2, r.rootB) || !anchoredAt(c2, r.rootB) {
			t.Fatalf("a second after RootsChanged, the leaves are not of root B")
		}
		if !trusts(a2, r.rootA) || !trusts(a2, r.rootB) {
			t.Errorf("TrustedRoots() = %d roots, want A and B", len(a2.TrustedRoots()))
		}
		wantBothWays(t, "old leaf and new leaf", a, c2)
		wantBothWays(t, "old leaf and new leaf", c, a2)
	})
}

// TestOldRootDroppedAfterGrace: a root the CA no longer answers is trusted
// for RootGrace after its first answer without it, however long leaves of
// it stay valid, and then refused; an unrelated root never is.
func TestOldRootDroppedAfterGrace(t *testing.T) {
	eachRotation(t, func(t *testing.T, r rotation) {
		f := &fakeIssuer{ca: r.a, ttl: time.Hour}
		m := certs.NewManager(certs.ManagerConfig{Issuer: f, RootGrace: 10 * time.Minute})
		stop := runManager(t, m)
		defer stop()
		hostile := issue(t, newCA(t), idB)
		mustGet(t, m, idA)
		time.Sleep(time.Minute)
		r.switchTo(f)
		b := mustGet(t, m, idB) // root A retired now
		peerA := issue(t, r.a, idC)

		time.Sleep(9*time.Minute + 59*time.Second)
		if !accepts(b, peerA) || !trusts(b, r.rootA) {
			t.Errorf("within the grace, a peer with a leaf of the old root is refused")
		}
		if accepts(b, hostile) {
			t.Errorf("within the grace, a peer of an unrelated root is accepted")
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if accepts(b, peerA) || trusts(b, r.rootA) {
			t.Errorf("after the grace, a peer with a leaf of the old root (valid until %v) is accepted", peerA.NotAfter())
		}
		if accepts(b, hostile) {
			t.Errorf("after the grace, a peer of an unrelated root is accepted")
		}
		if a := mustGet(t, m, idA); !accepts(b, a) || !trusts(a, r.rootB) || trusts(a, r.rootA) {
			t.Errorf("after the grace, A's renewed leaf is refused, or A's trust is not B alone")
		}
	})
}

// TestOldRootDroppedWhenUnneeded: before the grace is over, the old root
// is dropped once every leaf known to need it has expired: the node's own
// leaves of it, and a peer's accepted in a handshake after the switch.
func TestOldRootDroppedWhenUnneeded(t *testing.T) {
	for _, withPeer := range []bool{false, true} {
		name := "own leaves"
		if withPeer {
			name = "peer leaf"
		}
		t.Run(name, func(t *testing.T) {
			eachRotation(t, func(t *testing.T, r rotation) {
				f := &fakeIssuer{ca: r.a, ttl: time.Hour}
				m := certs.NewManager(certs.ManagerConfig{Issuer: f}) // grace: a day
				stop := runManager(t, m)
				defer stop()
				a := mustGet(t, m, idA) // the last leaf of root A we hold
				time.Sleep(time.Minute)
				r.switchTo(f)
				b := mustGet(t, m, idB)
				time.Sleep(30 * time.Minute)
				var peerA *certs.Cert
				if withPeer {
					peerA = issue(t, r.a, idC) // a peer still on root A
					if !accepts(b, peerA) {
						t.Fatal("a peer with a leaf of the old root is refused after the switch")
					}
				}
				time.Sleep(time.Until(a.NotAfter()) + time.Second)
				synctest.Wait()
				if got := trusts(b, r.rootA); got != withPeer {
					t.Errorf("once the node's own leaves of root A expired, root A trusted = %v, want %v", got, withPeer)
				}
				if withPeer {
					time.Sleep(time.Until(peerA.NotAfter()) + time.Second)
					synctest.Wait()
					if trusts(b, r.rootA) {
						t.Errorf("root A is still trusted once the peer's leaf of it expired")
					}
				}
				if !trusts(b, r.rootB) {
					t.Errorf("root B is not trusted")
				}
			})
		})
	}
}

// TestOldRootAnsweredAgain: an answer with the old root again (another
// istiod replica, not yet rotated) makes it current again and makes no
// certificate be fetched again: only a root never seen does.
func TestOldRootAnsweredAgain(t *testing.T) {
	eachRotation(t, func(t *testing.T, r rotation) {
		f := &fakeIssuer{ca: r.a, ttl: time.Hour}
		m := certs.NewManager(certs.ManagerConfig{Issuer: f, RootGrace: 10 * time.Minute})
		stop := runManager(t, m)
		defer stop()
		mustGet(t, m, idA)
		r.switchTo(f)
		mustGet(t, m, idB)
		time.Sleep(time.Second)
		synctest.Wait() // A's leaf renewed from B
		f.set(func(f *fakeIssuer) { f.ca, f.roots = r.a, nil })
		c := mustGet(t, m, idC) // the old replica answers root A
		calls := f.calls()
		time.Sleep(9 * time.Minute) // within the grace of B, which this answer left out
		synctest.Wait()
		if got := f.calls(); got != calls {
			t.Errorf("an answer with a known root made %d more fetches, want none", got-calls)
		}
		if !trusts(c, r.rootA) || !trusts(c, r.rootB) {
			t.Errorf("after the old root was answered again, roots A and B are not both trusted")
		}
	})
}
