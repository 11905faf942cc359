package istiocatest_test

import (
	"context"
	"testing"
	"time"

	"github.com/gozt/gozt/certs/istioca/istiocatest"
	"github.com/gozt/gozt/certs/localca"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	pb "istio.io/api/security/v1alpha1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// dial returns a raw IstioCertificateService client of srv over TCP.
func dial(t *testing.T, srv *istiocatest.Server, ca *localca.CA) pb.IstioCertificateServiceClient {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+srv.Addr(),
		grpc.WithTransportCredentials(credentials.NewTLS(istiocatest.ClientTLS(ca))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return pb.NewIstioCertificateServiceClient(cc)
}

func TestServerRecordsAndRefuses(t *testing.T) {
	ca, err := localca.New(localca.Config{})
	if err != nil {
		t.Fatal(err)
	}
	srv := istiocatest.NewServer(t, ca, nil)
	c := dial(t, srv, ca)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer x", "clusterid", "c1")
	st, _ := structpb.NewStruct(map[string]any{"ImpersonatedIdentity": "spiffe://td/ns/a/sa/a"})
	_, err = c.CreateCertificate(ctx, &pb.IstioCertificateRequest{Csr: "not a CSR", ValidityDuration: 60, Metadata: st})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("bad CSR: %v, want InvalidArgument", err)
	}
	reqs := srv.Requests()
	if len(reqs) != 1 {
		t.Fatalf("recorded %d requests, want 1", len(reqs))
	}
	r := reqs[0]
	if r.Authorization != "Bearer x" || r.ClusterID != "c1" || !r.HasImpersonated ||
		r.Impersonated != "spiffe://td/ns/a/sa/a" || r.TTL != time.Minute || r.CSR != nil || !r.Identity.IsZero() {
		t.Errorf("recorded %+v", r)
	}

	srv.SetMode(istiocatest.Error(codes.ResourceExhausted))
	if _, err := c.CreateCertificate(ctx, &pb.IstioCertificateRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("Error mode: %v, want ResourceExhausted", err)
	}

	// Down: the open connection is closed and new ones are refused.
	srv.SetDown(true)
	if _, err := c.CreateCertificate(ctx, &pb.IstioCertificateRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("down: %v, want Unavailable", err)
	}
	if _, err := srv.Dial(context.Background(), srv.Addr()); err == nil {
		t.Errorf("Dial while down succeeded")
	}
	srv.SetDown(false)
	if got, want := istiocatest.Delay(time.Second).String(), "Delay(1s)"; got != want {
		t.Errorf("Delay(1s).String() = %q, want %q", got, want)
	}
}
