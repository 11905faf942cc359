package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/certstest"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/certs/istioca/istiocatest"
	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/xds/xdstest"
)

// TestRootRotationWithoutOutage (istio/ztunnel#1679): pods A and C on one
// shared-mode gozt hold leaves of root A; istiod's CA moves to root B
// cross-signed by A, then to root D independent of B, each time rewriting
// the root file (CA_ROOT_CA, istio-ca-root-cert in a cluster). At every
// step, including while A has a new leaf and C, whose CA requests fail,
// still the old one, new connections go both ways over fresh mTLS
// handshakes (one stream per connection), the tunnel opened first keeps
// carrying bytes, config_dump's roots list what is trusted, and a client
// with a leaf of an unrelated root is refused. The old root is refused
// once ROOT_ROTATION_GRACE is over.
func TestRootRotationWithoutOutage(t *testing.T) {
	m := newMeshNet(t)
	m.node(1)
	a, c := m.pod(1, 2, true), m.pod(1, 3, true)
	d := m.pod(1, 4, false) // outside the mesh: the hostile clients' pod
	appA, appC := startApp(t, a, 8080), startApp(t, c, 8080)

	dirA, dirB := t.TempDir(), t.TempDir()
	caA := mustCA(t, localca.Config{Dir: dirA})
	rootB := mustCA(t, localca.Config{Dir: dirB}).Roots()[0]
	caB := mustCA(t, localca.Config{Dir: certstest.CrossSign(t, dirA, dirB)})
	caD := mustCA(t, localca.Config{})
	rootA, rootD := caA.Roots()[0], caD.Roots()[0]
	stls := istiocatest.ServerTLS(t, caA, "127.0.0.1") // istiod's own certificate stays under A
	cp := &controlPlane{ca: caA, xds: xdstest.NewServer(t, stls), cas: istiocatest.NewServer(t, caA, stls)}
	rootPath := filepath.Join(t.TempDir(), "root-cert.pem")
	writeRoots(t, rootPath, rootA)
	n := cp.startShared(t, "node1", "CA_ROOT_CA="+rootPath, "ROOT_ROTATION_GRACE=30s", "POOL_MAX_STREAMS_PER_CONNECTION=1")
	cp.xds.PushWorkload(meshWorkload("a", a.ip, "node1"), meshWorkload("c", c.ip, "node1"))
	n.add(t, "uid-a", a, "a")
	n.add(t, "uid-c", c, "c")
	n.snapshotSent(t)
	idA, idC := "spiffe://cluster.local/ns/demo/sa/a", "spiffe://cluster.local/ns/demo/sa/c"
	hostile, err := mustCA(t, localca.Config{}).Issue(context.Background(), identity.MustParse(idA))
	if err != nil {
		t.Fatal(err)
	}

	seed := uint64(0)
	live := openLiveFrom(t, a, c.ip+":8080")
	step := func(name string, roots ...*x509.Certificate) {
		t.Helper()
		for _, dir := range []struct {
			from, to pod
			app      *app
		}{{a, c, appC}, {c, a, appA}} {
			seed++
			conn, err := dialFrom(t, dir.from, dir.to.ip+":8080")
			if err == nil {
				err = exchange(conn, seed, 64<<10)
				conn.Close()
			}
			if err != nil {
				t.Errorf("%s: %s → %s: %v", name, dir.from.ip, dir.to.ip, err)
			} else if got := dir.app.last(); got != dir.from.ip {
				t.Errorf("%s: %s → %s: the app saw source %s", name, dir.from.ip, dir.to.ip, got)
			}
		}
		if err := ping(live); err != nil {
			t.Errorf("%s: the tunnel opened before the rotation: %v", name, err)
		}
		if !clientRefused(t, d, c.ip+":15008", hostile, idC) {
			t.Errorf("%s: a client with a leaf of an unrelated root was accepted", name)
		}
		for _, id := range []string{idA, idC} {
			if got, want := rootSerials(t, n.Node, id), serials(roots...); !slices.Equal(got, want) {
				t.Errorf("%s: config_dump rootCerts of %s = %v, want %v", name, id, got, want)
			}
		}
	}
	leafOf := func(id string, root *x509.Certificate) func() bool {
		return func() bool { return ownLeaf(t, n.Node, id).CheckSignatureFrom(root) == nil }
	}
	eventually(t, 10*time.Second, "leaves of root A", func() bool { return leafOf(idA, rootA)() && leafOf(idC, rootA)() })
	step("before", rootA)

	// A cross-signed root B: C's requests fail, so C keeps its leaf of A
	// while A moves to B.
	cidC := identity.MustParse(idC)
	cp.cas.SetModeFor(cidC, istiocatest.Error(codes.Unavailable))
	cp.cas.SetCA(caB, []*x509.Certificate{rootB})
	writeRoots(t, rootPath, rootA, rootB)
	eventually(t, 15*time.Second, "A's leaf of root B", leafOf(idA, rootB))
	if !leafOf(idC, rootA)() {
		t.Fatal("C's leaf is not of root A while its requests fail")
	}
	step("A on root B, C on root A", rootA, rootB)
	cp.cas.SetModeFor(cidC, istiocatest.OK)
	eventually(t, 15*time.Second, "C's leaf of root B", leafOf(idC, rootB))
	step("both on root B", rootA, rootB)

	// Root A goes ROOT_ROTATION_GRACE after the CA last answered it, though
	// leaves of A are valid for a day.
	oldA, err := caA.Issue(context.Background(), identity.MustParse(idA))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 40*time.Second, "root A dropped", func() bool { return len(rootSerials(t, n.Node, idC)) == 1 })
	if !clientRefused(t, d, c.ip+":15008", oldA, idC) {
		t.Error("a client with a leaf of root A was accepted after the grace")
	}
	step("root A dropped", rootB)

	// Root D independent of B: A's requests fail this time.
	cp.cas.SetModeFor(identity.MustParse(idA), istiocatest.Error(codes.Unavailable))
	cp.cas.SetCA(caD, nil)
	writeRoots(t, rootPath, rootA, rootB, rootD) // A stays: istiod's own certificate is under it
	eventually(t, 15*time.Second, "C's leaf of root D", leafOf(idC, rootD))
	if !leafOf(idA, rootB)() {
		t.Fatal("A's leaf is not of root B while its requests fail")
	}
	step("A on root B, C on root D", rootB, rootD)
	cp.cas.SetModeFor(identity.MustParse(idA), istiocatest.OK)
	eventually(t, 15*time.Second, "A's leaf of root D", leafOf(idA, rootD))
	step("both on root D", rootB, rootD)
}

func mustCA(t *testing.T, cfg localca.Config) *localca.CA {
	t.Helper()
	ca, err := localca.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// writeRoots replaces the root file at path with roots, as kubelet swaps a
// ConfigMap's files.
func writeRoots(t *testing.T, path string, roots ...*x509.Certificate) {
	t.Helper()
	var data []byte
	for _, r := range roots {
		data = append(data, pemCert(r)...)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// openLiveFrom opens a connection from inside pod p to addr that stays
// open until the test ends, and checks one echo.
func openLiveFrom(t *testing.T, p pod, addr string) net.Conn {
	t.Helper()
	conn, err := dialFrom(t, p, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := ping(conn); err != nil {
		t.Fatalf("first ping through %s: %v", addr, err)
	}
	return conn
}

// clientRefused reports whether the inbound at addr, reached from inside
// pod p, refuses a TLS client presenting cert (the client checks nothing
// itself: the server's verdict is what is tested).
func clientRefused(t *testing.T, p pod, addr string, cert *certs.Cert, serverID string) bool {
	t.Helper()
	cfg := certs.ClientConfig(cert, []string{serverID})
	cfg.VerifyConnection = nil
	var raw net.Conn
	inPod(t, p, func() (err error) {
		raw, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	})
	defer raw.Close()
	tc := tls.Client(raw, cfg)
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	err := tc.Handshake()
	if err == nil {
		// TLS 1.3: the server's verdict on the client certificate
		// arrives with the first read; an accepted client reads nothing
		// until the deadline.
		_, err = tc.Read(make([]byte, 1))
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return false
		}
	}
	return err != nil
}

// rootSerials returns the sorted serial numbers of the rootCerts that
// n's /config_dump lists for identity id.
func rootSerials(t *testing.T, n *Node, id string) []string {
	t.Helper()
	var dump struct {
		Certificates []struct {
			Identity  string `json:"identity"`
			RootCerts []struct {
				SerialNumber string `json:"serialNumber"`
			} `json:"rootCerts"`
		} `json:"certificates"`
	}
	if err := json.Unmarshal([]byte(get(t, "http://"+n.AdminAddr().String()+"/config_dump")), &dump); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range dump.Certificates {
		if c.Identity == id {
			for _, r := range c.RootCerts {
				out = append(out, r.SerialNumber)
			}
		}
	}
	slices.Sort(out)
	return out
}

func serials(roots ...*x509.Certificate) []string {
	var out []string
	for _, r := range roots {
		out = append(out, r.SerialNumber.String())
	}
	slices.Sort(out)
	return out
}

func pemCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}
