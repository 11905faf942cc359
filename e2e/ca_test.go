package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/url"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
	pb "istio.io/api/security/v1alpha1"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gozt/gozt/e2e/internal/cluster"
)

// testNodeAuthorizer checks what lets gozt hold the leaves of TestScenario8:
// gozt's only credential is its pod's projected token of the ztunnel
// service account (audience istio-ca), and istiod's node authorizer issues
// a leaf for another identity on that token only for an identity that has
// a pod on gozt's node. The test sends istiod's CA what gozt sends (the same
// kind of token, bound to the gozt pod, and the ImpersonatedIdentity
// metadata): for the client's identity it gets a leaf naming that identity;
// for a service account with no pod, a refusal.
func testNodeAuthorizer(ctx context.Context, t *testing.T, ns string, gozt *corev1.Pod, roots *x509.CertPool) {
	if sa := gozt.Spec.ServiceAccountName; sa != "ztunnel" {
		t.Errorf("the gozt pod runs as service account %q, want ztunnel", sa)
	}
	var projected bool
	for _, v := range gozt.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if s.ServiceAccountToken != nil && s.ServiceAccountToken.Audience == "istio-ca" {
				projected = true
			}
		}
	}
	if !projected {
		t.Errorf("the gozt pod mounts no projected token for audience istio-ca")
	}

	exp := int64(600)
	tr, err := cl.cs.CoreV1().ServiceAccounts(cluster.IstioNamespace).CreateToken(ctx, "ztunnel", &authv1.TokenRequest{
		Spec: authv1.TokenRequestSpec{
			Audiences:         []string{"istio-ca"},
			ExpirationSeconds: &exp,
			BoundObjectRef:    &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: gozt.Name, UID: gozt.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of istio-system/ztunnel bound to %s: %v", gozt.Name, err)
	}
	istiod := waitPodsReady(ctx, t, cluster.IstioNamespace, "app=istiod", time.Minute)[0]
	conn, err := grpc.NewClient(net.JoinHostPort(istiod.Status.PodIP, "15012"), grpc.WithTransportCredentials(
		credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "istiod.istio-system.svc"})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ca := pb.NewIstioCertificateServiceClient(conn)
	issue := func(id string) (*pb.IstioCertificateResponse, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		u, err := url.Parse(id)
		if err != nil {
			t.Fatal(err)
		}
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{u}}, key)
		if err != nil {
			t.Fatal(err)
		}
		req := &pb.IstioCertificateRequest{
			Csr:              string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})),
			ValidityDuration: 3600,
			Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
				"ImpersonatedIdentity": structpb.NewStringValue(id),
			}},
		}
		cctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx,
			"authorization", "Bearer "+tr.Status.Token, "clusterid", "Kubernetes"), 10*time.Second)
		defer cancel()
		return ca.CreateCertificate(cctx, req)
	}

	t.Run("IssuesForAPodOnTheNode", func(t *testing.T) {
		id := spiffeID(ns, "client")
		resp, err := issue(id)
		if err != nil {
			t.Fatalf("istiod refused %s on the ztunnel token: %v", id, err)
		}
		chain := resp.GetCertChain()
		if len(chain) == 0 {
			t.Fatalf("istiod answered %s with an empty chain", id)
		}
		blk, _ := pem.Decode([]byte(chain[0]))
		if blk == nil {
			t.Fatalf("istiod's leaf for %s is not PEM", id)
		}
		leaf, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id {
			t.Errorf("leaf issued for %s names %v", id, leaf.URIs)
		}
	})
	t.Run("RefusesAnIdentityWithNoPodOnTheNode", func(t *testing.T) {
		createServiceAccount(ctx, t, ns, "nobody")
		id := spiffeID(ns, "nobody")
		if resp, err := issue(id); err == nil {
			t.Errorf("istiod issued %s (no pod runs as it) on the ztunnel token: %d certificates", id, len(resp.GetCertChain()))
		} else {
			t.Logf("refused, as it should be: %v", err)
		}
	})
}
