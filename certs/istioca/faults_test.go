package istioca_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/istioca"
	"github.com/gozt/gozt/certs/istioca/istiocatest"
	"github.com/gozt/gozt/certs/localca"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The fault tests (TESTPLAN F7–F10) run a certs.Manager on an istioca
// Client talking gRPC over TLS to the fake CA. Where time matters they run
// in a synctest bubble over in-memory connections.

// stack is a Manager on a Client on a fake CA.
type stack struct {
	ca  *localca.CA
	srv *istiocatest.Server
	m   *certs.Manager
}

// newStack must be called inside a synctest bubble. Run starts at once and
// stops at the end of the test.
func newStack(t *testing.T, ttl time.Duration) *stack {
	t.Helper()
	ca := newCA(t)
	srv := istiocatest.NewInMemoryServer(t, ca, nil)
	c := newClient(t, istioca.Config{
		Address: srv.URL(),
		TLS:     istiocatest.ClientTLS(ca),
		Dialer:  srv.Dial,
		TTL:     ttl,
	})
	m := certs.NewManager(certs.ManagerConfig{Issuer: c})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
	return &stack{ca: ca, srv: srv, m: m}
}

func mustGet(t *testing.T, m *certs.Manager, id identity.Identity) *certs.Cert {
	t.Helper()
	c, err := m.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("Get(%v): %v", id, err)
	}
	return c
}

// handshake runs an HBONE TLS handshake over an in-memory connection: a
// server with certs.ServerConfig(get) and a client presenting cli that
// expects the server to be want. It returns the first error of either side.
func handshake(get func(context.Context) (*certs.Cert, error), cli *certs.Cert, want identity.Identity) error {
	sc, cc := net.Pipe()
	var serverErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		defer sc.Close()
		s := tls.Server(sc, certs.ServerConfig(get))
		if serverErr = s.Handshake(); serverErr == nil {
			_, serverErr = s.Write([]byte("ok"))
		}
	})
	c := tls.Client(cc, certs.ClientConfig(cli, []string{want.String()}))
	err := c.Handshake()
	if err == nil {
		_, err = io.ReadFull(c, make([]byte, 2))
	}
	cc.Close()
	wg.Wait()
	return errors.Join(err, serverErr)
}

// getter is the ServerConfig callback that serves m's cert for id.
func getter(m *certs.Manager, id identity.Identity) func(context.Context) (*certs.Cert, error) {
	return func(ctx context.Context) (*certs.Cert, error) { return m.Get(ctx, id) }
}

// TestF7CADownDuringRotation: the CA fails from the refresh time on while
// the cert is still valid. Every Get and handshake keeps working with the
// old cert, retries back off, and the cert is replaced once the CA is back.
func TestF7CADownDuringRotation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newStack(t, time.Hour)
		c1 := mustGet(t, s.m, idA)
		cB := mustGet(t, s.m, idB)
		s.srv.SetMode(istiocatest.Error(codes.Unavailable))
		down := c1.RefreshTime().Add(-time.Minute)
		time.Sleep(time.Until(down))

		back := c1.NotAfter().Add(-10 * time.Minute)
		errs := 0
		for time.Now().Before(back) {
			if c, err := s.m.Get(context.Background(), idA); err != nil || c != c1 {
				errs++
			}
			if err := handshake(getter(s.m, idA), cB, idA); err != nil {
				t.Errorf("handshake at %v: %v", time.Until(c1.NotAfter()), err)
				errs++
			}
			time.Sleep(10 * time.Second)
		}
		if errs != 0 {
			t.Errorf("%d errors while the CA was down and the cert valid, want 0", errs)
		}
		var retries []time.Time
		for _, r := range s.srv.Requests() {
			if r.Identity == idA && r.Received.After(down) {
				retries = append(retries, r.Received)
			}
		}
		if len(retries) < 10 {
			t.Fatalf("only %d attempts in 20 minutes of CA failure", len(retries))
		}
		if !retries[0].Equal(c1.RefreshTime()) {
			t.Errorf("first refresh at %v, want the half-life %v", retries[0], c1.RefreshTime())
		}
		for i := 1; i < len(retries); i++ {
			if d := retries[i].Sub(retries[i-1]); d < 800*time.Millisecond || d > 150*time.Second {
				t.Errorf("retry %d after %v, want within [0.8s, 150s]", i, d)
			}
		}

		s.srv.SetMode(istiocatest.OK)
		time.Sleep(150 * time.Second)
		c2 := mustGet(t, s.m, idA)
		if c2 == c1 || !c2.NotAfter().After(c1.NotAfter()) {
			t.Errorf("cert not renewed within 150s of the CA's return")
		}
	})
}

// TestF8CADownUntilExpiry: the CA is unreachable until the cert expires.
// Then Get fails at once with the connection error (fail closed; TESTPLAN
// S29), handshakes needing the identity fail, and the identity works again
// within one maximum backoff of the CA's return.
func TestF8CADownUntilExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newStack(t, 10*time.Minute)
		c1 := mustGet(t, s.m, idA)
		cB := mustGet(t, s.m, idB)
		s.srv.SetDown(true)
		time.Sleep(time.Until(c1.NotAfter()) + time.Second)

		start := time.Now()
		_, err := s.m.Get(context.Background(), idA)
		if err == nil {
			t.Fatal("Get after expiry with the CA down succeeded")
		}
		if time.Since(start) != 0 {
			t.Errorf("failing Get waited %v", time.Since(start))
		}
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("Get error = %v, want Unavailable …connection refused", err)
		}
		for _, st := range s.m.States() {
			if st.Identity == idA && !strings.HasPrefix(st.Status, "Unavailable: ") {
				t.Errorf("status = %q, want Unavailable", st.Status)
			}
		}
		if err := handshake(getter(s.m, idA), cB, idA); err == nil {
			t.Errorf("handshake with an expired cert and no CA succeeded")
		}
		// A new identity fails at once too, and does not hang on the CA.
		idC := identity.MustParse("spiffe://cluster.local/ns/c/sa/c")
		if _, err := s.m.Get(context.Background(), idC); status.Code(err) != codes.Unavailable {
			t.Errorf("Get(new identity) with the CA down = %v, want Unavailable", err)
		}
		if time.Since(start) != 0 {
			t.Errorf("Gets with the CA down waited %v", time.Since(start))
		}

		// Let the backoff reach its maximum, then bring the CA back.
		time.Sleep(10 * time.Minute)
		s.srv.SetDown(false)
		back := time.Now()
		// The client's connection is not left backing off: a new
		// identity is issued at once.
		idD := identity.MustParse("spiffe://cluster.local/ns/d/sa/d")
		if _, err := s.m.Get(context.Background(), idD); err != nil {
			t.Errorf("Get(new identity) just after the CA returned: %v", err)
		}
		for {
			if _, err := s.m.Get(context.Background(), idA); err == nil {
				break
			}
			if time.Since(back) > 150*time.Second {
				t.Fatalf("identity still unavailable %v after the CA returned", time.Since(back))
			}
			time.Sleep(time.Second)
		}
		cB, err = s.ca.Issue(context.Background(), idB) // a valid client cert
		if err != nil {
			t.Fatal(err)
		}
		if err := handshake(getter(s.m, idA), cB, idA); err != nil {
			t.Errorf("handshake after recovery: %v", err)
		}
	})
}

// TestF9SlowCA: while the CA takes 5s for one identity, Gets and handshakes
// for a cached identity, and the issue of another new identity, do not
// wait.
func TestF9SlowCA(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newStack(t, time.Hour)
		cB := mustGet(t, s.m, idB)
		s.srv.SetModeFor(idA, istiocatest.Delay(5*time.Second))

		start := time.Now()
		var cA *certs.Cert
		var waited time.Duration
		var wg sync.WaitGroup
		wg.Go(func() {
			cA = mustGet(t, s.m, idA)
			waited = time.Since(start)
		})
		synctest.Wait() // the request for idA is at the CA

		if c := mustGet(t, s.m, idB); c != cB {
			t.Errorf("Get(idB) returned another cert")
		}
		if err := handshake(getter(s.m, idB), cB, idB); err != nil {
			t.Errorf("handshake for idB during the slow fetch: %v", err)
		}
		idC := identity.MustParse("spiffe://cluster.local/ns/c/sa/c")
		if c := mustGet(t, s.m, idC); c.Identity != idC {
			t.Errorf("Get(idC) = %v", c.Identity)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("other identities waited %v behind the slow one", d)
		}
		wg.Wait()
		if cA == nil || waited != 5*time.Second {
			t.Errorf("Get(idA) = %v after %v, want a cert after 5s", cA, waited)
		}
	})
}

// TestF10RootRotation: the CA announces a new root next to the old one,
// then signs with the new one. A workload holding a new-root cert and one
// holding an old-root cert (both received with the old+new bundle) still
// handshake in both directions (ztunnel #1679). A control: a cert received
// before the new root was announced cannot verify the new one.
func TestF10RootRotation(t *testing.T) {
	oldCA, newCA := newCA(t), newCA(t)
	srv := istiocatest.NewServer(t, oldCA, nil)
	c := newClient(t, istioca.Config{Address: srv.URL(), TLS: istiocatest.ClientTLS(oldCA)})
	both := append(oldCA.Roots(), newCA.Roots()...)
	issue := func(id identity.Identity) *certs.Cert {
		t.Helper()
		cert, err := c.Issue(context.Background(), id)
		if err != nil {
			t.Fatalf("Issue(%v): %v", id, err)
		}
		return cert
	}

	bOldOnly := issue(idB) // before the rotation
	srv.SetCA(oldCA, both)
	bOld := issue(idB) // old signer, old+new roots
	srv.SetCA(newCA, both)
	aNew := issue(idA) // new signer, old+new roots

	if len(aNew.Roots) != 2 || len(bOld.Roots) != 2 {
		t.Fatalf("root bundles hold %d and %d roots, want 2", len(aNew.Roots), len(bOld.Roots))
	}
	signedBy := func(cert *certs.Cert, ca *localca.CA) bool {
		return cert.Chain()[0].CheckSignatureFrom(ca.Roots()[0]) == nil
	}
	if !signedBy(aNew, newCA) || !signedBy(bOld, oldCA) {
		t.Fatalf("certs not signed by the expected CAs")
	}
	serve := func(c *certs.Cert) func(context.Context) (*certs.Cert, error) {
		return func(context.Context) (*certs.Cert, error) { return c, nil }
	}
	if err := handshake(serve(bOld), aNew, idB); err != nil {
		t.Errorf("new-root client → old-root server: %v", err)
	}
	if err := handshake(serve(aNew), bOld, idA); err != nil {
		t.Errorf("old-root client → new-root server: %v", err)
	}
	if err := handshake(serve(bOldOnly), aNew, idB); !errors.Is(err, certs.ErrUntrusted) &&
		!strings.Contains(errString(err), "bad certificate") {
		t.Errorf("server without the new root accepted a new-root client: %v", err)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestManagerBadAnswers: a malformed answer during rotation is refused,
// the old cert kept and the request retried with backoff; for a new
// identity Get reports it (TESTPLAN bad inputs 48–50).
func TestManagerBadAnswers(t *testing.T) {
	for _, tt := range []struct {
		mode istiocatest.Mode
		want error
	}{
		{istiocatest.WrongIdentity, certs.ErrIdentityMismatch},
		{istiocatest.EmptyChain, certs.ErrEmptyChain},
		{istiocatest.LeafOnly, certs.ErrNoRoots},
		{istiocatest.Expired, certs.ErrExpired},
		{istiocatest.NotYetValid, certs.ErrUntrusted},
		{istiocatest.WrongKey, certs.ErrKeyMismatch},
	} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newStack(t, time.Hour)
				c1 := mustGet(t, s.m, idA)
				s.srv.SetMode(tt.mode)
				time.Sleep(time.Until(c1.RefreshTime()) + 10*time.Second)
				if c := mustGet(t, s.m, idA); c != c1 {
					t.Errorf("Get after refused answers did not return the old cert")
				}
				reqs := s.srv.Requests()
				if n := len(reqs) - 1; n < 3 || n > 5 {
					t.Errorf("%d attempts in the 10s after refresh, want 3–5 (backoff 1s, 2s, 4s)", n)
				}
				if _, err := s.m.Get(context.Background(), idB); !errors.Is(err, tt.want) {
					t.Errorf("Get(new identity) = %v, want %v", err, tt.want)
				}
			})
		})
	}
}
