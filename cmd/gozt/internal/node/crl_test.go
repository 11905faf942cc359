package node

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gozt/gozt/certs/istioca/istiocatest"
	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/xds/xdstest"
	xproxy "golang.org/x/net/proxy"
)

// TestCRLRevokesLiveAndNewTunnels (SPEC §2.1, CRL_PATH): two dedicated
// proxies share a CRL file. Once it revokes the client's certificate, the
// server closes the tunnel already open from that client, refuses new
// handshakes from it, and counts both in istio_crl_policy_rejections_total.
func TestCRLRevokesLiveAndNewTunnels(t *testing.T) {
	clientIP, serverIP := "127.89.1.2", "127.89.1.3"
	caDir := t.TempDir()
	ca, err := localca.New(localca.Config{Dir: caDir})
	if err != nil {
		t.Fatal(err)
	}
	stls := istiocatest.ServerTLS(t, ca, "127.0.0.1")
	cp := &controlPlane{ca: ca, xds: xdstest.NewServer(t, stls), cas: istiocatest.NewServer(t, ca, stls)}
	crlPath := filepath.Join(t.TempDir(), "ca-crl.pem") // absent at start: nothing revoked
	client := cp.startNodeEnv(t, "client", clientIP, "CRL_PATH="+crlPath)
	server := cp.startNodeEnv(t, "server", serverIP, "CRL_PATH="+crlPath)
	echo(t, serverIP+":8080")
	cp.xds.PushWorkload(workload("client", clientIP), workload("server", serverIP))

	d, _ := xproxy.SOCKS5("tcp", clientIP+":15080", nil, xproxy.Direct)
	live := openLive(t, d, serverIP+":8080") // before any revocation

	leaf := ownLeaf(t, client, "spiffe://cluster.local/ns/demo/sa/client")
	writeCRL(t, crlPath, caDir, ca, leaf.SerialNumber)

	// The open tunnel is closed at the next reload (CRLPollInterval).
	live.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := live.Read(make([]byte, 1)); err == nil {
		t.Fatal("the tunnel from a revoked client read data")
	} else if strings.Contains(err.Error(), "timeout") {
		t.Fatal("the tunnel from a revoked client is still open 10s after the CRL revoked it")
	}
	if err := socksPing(clientIP, serverIP+":8080"); err == nil {
		t.Error("a new connection from the revoked client went through")
	}
	waitFor(t, func() bool {
		m := get(t, "http://"+server.MetricsAddr().String()+"/metrics")
		return metricAtLeast(m, `istio_crl_policy_rejections_total{reporter="destination"}`, 2)
	}, "istio_crl_policy_rejections_total to count the closed tunnel and the refused handshake")
}

// ownLeaf returns the certificate of identity id from n's /config_dump.
func ownLeaf(t *testing.T, n *Node, id string) *x509.Certificate {
	t.Helper()
	var dump struct {
		Certificates []struct {
			Identity  string `json:"identity"`
			CertChain []struct {
				PEM string `json:"pem"`
			} `json:"certChain"`
		} `json:"certificates"`
	}
	var leaf *x509.Certificate
	waitFor(t, func() bool {
		if err := json.Unmarshal([]byte(get(t, "http://"+n.AdminAddr().String()+"/config_dump")), &dump); err != nil {
			t.Fatal(err)
		}
		for _, c := range dump.Certificates {
			if c.Identity != id || len(c.CertChain) == 0 {
				continue
			}
			p, err := base64.StdEncoding.DecodeString(c.CertChain[0].PEM)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := pem.Decode(p)
			if b == nil {
				t.Fatalf("certificate of %s is not PEM", id)
			}
			if leaf, err = x509.ParseCertificate(b.Bytes); err != nil {
				t.Fatal(err)
			}
			return true
		}
		return false
	}, "the certificate of "+id)
	return leaf
}

// writeCRL writes a PEM CRL of the CA in caDir revoking serials.
func writeCRL(t *testing.T, path, caDir string, ca *localca.CA, serials ...*big.Int) {
	t.Helper()
	kb, err := os.ReadFile(filepath.Join(caDir, "ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(kb)
	if b == nil {
		t.Fatal("ca-key.pem is not PEM")
	}
	key, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		if key, err = x509.ParseECPrivateKey(b.Bytes); err != nil {
			t.Fatalf("ca-key.pem: %v", err)
		}
	}
	tmpl := &x509.RevocationList{Number: big.NewInt(time.Now().UnixNano()), ThisUpdate: time.Now(), NextUpdate: time.Now().Add(time.Hour)}
	for _, s := range serials {
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries, x509.RevocationListEntry{SerialNumber: s, RevocationTime: time.Now()})
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, ca.Roots()[0], key.(crypto.Signer))
	if err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// metricAtLeast reports whether the sample named (with its labels, as
// written) is at least min.
func metricAtLeast(metrics, sample string, min float64) bool {
	for _, line := range strings.Split(metrics, "\n") {
		if rest, ok := strings.CutPrefix(line, sample+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err == nil && v >= min {
				return true
			}
		}
	}
	return false
}

// waitFor polls cond until it holds, for at most 15 s.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
