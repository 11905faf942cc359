package istioca

import (
	"context"
	"testing"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/localca"
)

// TestCACacheSharesCAsNotLeaves: a CA certificate parsed twice is one
// parsed copy; a leaf is parsed afresh every time and never kept; and the
// cache never holds more than maxCACerts however many CAs pass through.
func TestCACacheSharesCAsNotLeaves(t *testing.T) {
	var cc caCache
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	root := ca.Roots()[0].Raw
	a, err := cc.parse(root)
	if err != nil {
		t.Fatal(err)
	}
	b, err := cc.parse(append([]byte(nil), root...))
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Errorf("the root parsed twice is two copies; want one shared")
	}
	leafCert, err := ca.Issue(context.Background(), identity.MustParse("spiffe://cluster.local/ns/a/sa/a"))
	if err != nil {
		t.Fatal(err)
	}
	leaf := leafCert.Chain()[0].Raw
	l1, err := cc.parse(leaf)
	if err != nil {
		t.Fatal(err)
	}
	l2, _ := cc.parse(leaf)
	if l1 == l2 || len(cc.certs) != 1 {
		t.Errorf("a leaf was kept (same copy twice: %v; %d cached, want the root alone)", l1 == l2, len(cc.certs))
	}
	for range maxCACerts + 4 {
		other, err := localca.New(localca.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cc.parse(other.Roots()[0].Raw); err != nil {
			t.Fatal(err)
		}
		if len(cc.certs) > maxCACerts {
			t.Fatalf("cache holds %d CA certificates, more than %d", len(cc.certs), maxCACerts)
		}
	}
	if _, err := cc.parse([]byte("not DER")); err == nil {
		t.Error("parse of junk succeeded")
	}
}
