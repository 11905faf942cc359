package node

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/gozt/gozt/certs/localca"
)

// TestRootFileChangeRenews: when CA_ROOT_CA's file gets other
// certificates (istiod rewrote istio-ca-root-cert for a new root), the
// node asks the CA for its workload's certificate again at once, not at
// half-life a day later; rewriting the same content asks nothing.
func TestRootFileChangeRenews(t *testing.T) {
	ip := "127.89.4.2"
	cp := newControlPlane(t)
	path := filepath.Join(t.TempDir(), "root-cert.pem")
	writeRoots(t, path, cp.ca.Roots()...)
	n := cp.startNodeEnv(t, "client", ip, "CA_ROOT_CA="+path)
	cp.xds.PushWorkload(workload("client", ip))
	id := "spiffe://cluster.local/ns/demo/sa/client"
	first := ownLeaf(t, n, id)
	requests := func() int { return len(cp.cas.Requests()) }
	before := requests()

	writeRoots(t, path, cp.ca.Roots()...) // same certificates
	time.Sleep(rootPollInterval + time.Second)
	if got := requests() - before; got != 0 {
		t.Errorf("rewriting the root file unchanged made %d certificate requests, want 0", got)
	}
	other, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	writeRoots(t, path, append(cp.ca.Roots(), other.Roots()...)...)
	waitFor(t, func() bool { return !ownLeaf(t, n, id).Equal(first) }, "a new certificate after the root file changed")
	if got := requests() - before; got != 1 {
		t.Errorf("the root file's changes made %d certificate requests, want 1", got)
	}
}
