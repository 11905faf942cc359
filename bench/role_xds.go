package bench

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"istio.io/istio/pkg/workloadapi"

	"github.com/gozt/gozt/certs/istioca/istiocatest"
	"github.com/gozt/gozt/certs/localca"
	"github.com/gozt/gozt/xds"
	"github.com/gozt/gozt/xds/xdsserver"
)

// xdsRole is the fake istiod of the xDS push scenario: xdsserver's delta ADS
// server (the project's one fake xDS server; tests use it through xdstest),
// in its own process so that building and sending a push does not compete
// with the harness's probe inside one Go runtime.
//
// Commands: "wait-clients N" waits until N streams have been opened in all
// (closed ones count); "prepare N
// TAG" builds the resources of the next "push N TAG" without sending them;
// "push N TAG" pushes N new workloads named after TAG in one response and
// answers, as JSON, the time until every client ACKed it and the wire size;
// "remove N TAG" removes them again the same way.
//
// With --ca it also serves istiod's CA (certs/istioca/istiocatest, the
// project's one fake CA), and with --pods N it holds the workloads of the
// node scenario's N pods from the start (node.go).
//
// The role stands for istiod, which runs on another machine than the
// proxies it serves: with --low-priority (the harness's choice) every thread
// of the process runs at nice 19, and prepare builds a push before the
// scenario starts watching its live connection, so that what the scenario
// measures is what the push costs the proxies, not what a control plane on
// the same two cores costs them.
type xdsRole struct {
	srv      *xdsserver.Server
	ca       *istiocatest.Server // the CA of --ca, or nil
	clients  int
	caFile   string
	prepared preparedPush
}

// preparedPush is a push built by prepare and not yet sent.
type preparedPush struct {
	n    int
	tag  string
	rs   []*discoveryv3.Resource
	wire int
}

func startXDS(_ context.Context, args []string) (role, error) {
	fs := flag.NewFlagSet("xds", flag.ContinueOnError)
	caFile := fs.String("ca-out", "", "write the server's certificate (PEM) to `FILE`")
	clients := fs.Int("clients", 2, "clients that must ACK each push")
	low := fs.Bool("low-priority", false, "run every thread at nice 19, as a control plane off the node")
	withCA := fs.Bool("ca", false, "also serve istiod's CA (IstioCertificateService) with the same certificate")
	pods := fs.Int("pods", 0, "hold the workloads of `N` pods of the node scenario (nodePodWorkload)")
	podNode := fs.String("pod-node", "", "the node name of the --pods workloads")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if *low {
		if err := lowestPriority(); err != nil {
			return nil, err
		}
	}
	srvTLS, _, err := xdsserver.TLSConfigs()
	if err != nil {
		return nil, err
	}
	der := srvTLS.Certificates[0].Certificate[0]
	if err := os.WriteFile(*caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return nil, err
	}
	srv, err := xdsserver.New(srvTLS)
	if err != nil {
		return nil, err
	}
	x := &xdsRole{srv: srv, clients: *clients, caFile: *caFile}
	for i := range *pods {
		srv.PushWorkload(nodePodWorkload(i, *podNode))
	}
	if *withCA {
		if x.ca, err = startCA(srvTLS); err != nil {
			srv.Close()
			return nil, err
		}
	}
	return x, nil
}

// startCA serves a CA signing with a fresh localca root on 127.0.0.1 with
// the xDS server's certificate, so that one root file verifies both.
func startCA(srvTLS *tls.Config) (*istiocatest.Server, error) {
	ca, err := localca.New(localca.Config{})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	return istiocatest.Serve(ca, srvTLS, lis)
}

func (x *xdsRole) info() map[string]string {
	m := map[string]string{"addr": "https://" + x.srv.Addr(), "ca": x.caFile}
	if x.ca != nil {
		m["ca_addr"] = x.ca.URL()
	}
	return m
}

func (x *xdsRole) stats(m map[string]any) { m["streams"] = x.srv.Connections() }

func (x *xdsRole) close() error {
	x.srv.Close()
	if x.ca != nil {
		x.ca.Close()
	}
	return nil
}

func (x *xdsRole) command(ctx context.Context, name string, args []string) (string, error) {
	switch name {
	case "wait-clients":
		n, err := strconv.Atoi(argOr(args, 0, ""))
		if err != nil {
			return "", err
		}
		for x.srv.Connections() < n {
			select {
			case <-ctx.Done():
				return "", ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
		return "", nil
	case "prepare":
		n, err := strconv.Atoi(argOr(args, 0, ""))
		if err != nil {
			return "", err
		}
		tag := argOr(args, 1, "w")
		rs, wire := buildPush(n, tag)
		x.prepared = preparedPush{n: n, tag: tag, rs: rs, wire: wire}
		return "", nil
	case "push", "remove":
		n, err := strconv.Atoi(argOr(args, 0, ""))
		if err != nil {
			return "", err
		}
		res, err := x.push(ctx, name == "remove", n, argOr(args, 1, "w"))
		if err != nil {
			return "", err
		}
		b, err := json.Marshal(res)
		return string(b), err
	}
	return "", fmt.Errorf("unknown command %q", name)
}

func argOr(args []string, i int, def string) string {
	if i < len(args) {
		return args[i]
	}
	return def
}

// pushResult is the reply to push and remove.
type pushResult struct {
	Seconds   float64 `json:"seconds"`    // from the push until the last client ACKed it
	WireBytes int     `json:"wire_bytes"` // size of the resources sent
	Prepared  bool    `json:"prepared"`   // the push was built by prepare, before it was timed
}

func (x *xdsRole) push(ctx context.Context, remove bool, n int, tag string) (pushResult, error) {
	var res pushResult
	var names []string
	p := x.prepared
	x.prepared = preparedPush{}
	if remove {
		names = make([]string, n)
		for i := range n {
			names[i] = pushWorkload(i, tag).GetUid()
		}
	} else {
		res.Prepared = p.n == n && p.tag == tag && p.rs != nil
		if !res.Prepared {
			p.rs, p.wire = buildPush(n, tag)
		}
		res.WireBytes = p.wire
	}
	start := time.Now()
	var nonce string
	if remove {
		nonce = x.srv.Remove(xds.AddressTypeURL, names...)
	} else {
		nonce = x.srv.Push(xds.AddressTypeURL, p.rs...)
	}
	if err := x.awaitACKs(ctx, nonce); err != nil {
		return res, err
	}
	res.Seconds = time.Since(start).Seconds()
	return res, nil
}

// buildPush returns the resources of a push of n workloads named after
// tag, and their wire size.
func buildPush(n int, tag string) ([]*discoveryv3.Resource, int) {
	rs := make([]*discoveryv3.Resource, n)
	wire := 0
	for i := range n {
		rs[i] = xdsserver.WorkloadResource(pushWorkload(i, tag))
		wire += proto.Size(rs[i])
	}
	return rs, wire
}

// awaitACKs waits until every client has ACKed the response nonce.
func (x *xdsRole) awaitACKs(ctx context.Context, nonce string) error {
	acks := 0
	timeout := time.After(callTimeout)
	for acks < x.clients {
		select {
		case req := <-x.srv.Requests():
			if req.GetResponseNonce() != nonce {
				continue
			}
			if req.GetErrorDetail() != nil {
				return fmt.Errorf("push NACKed: %s", req.GetErrorDetail().GetMessage())
			}
			acks++
		case <-timeout:
			return errors.New("push not ACKed in time")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// pushWorkload is the i-th workload of a push: a pod like those of a large
// cluster (1,000 namespaces, 500 nodes, 200 apps), HBONE, with a unique
// IP in 10.0.0.0/8.
func pushWorkload(i int, tag string) *workloadapi.Workload {
	ns := fmt.Sprintf("ns-%d", i%1000)
	app := fmt.Sprintf("app-%d", i%200)
	name := fmt.Sprintf("%s-%s-%d", app, tag, i)
	ip := []byte{10, byte(i >> 16), byte(i >> 8), byte(i)}
	return &workloadapi.Workload{
		Uid:               "Kubernetes//Pod/" + ns + "/" + name,
		Name:              name,
		Namespace:         ns,
		Addresses:         [][]byte{ip},
		Network:           "",
		TunnelProtocol:    workloadapi.TunnelProtocol_HBONE,
		TrustDomain:       trustDom,
		ServiceAccount:    fmt.Sprintf("sa-%d", i%50),
		Node:              fmt.Sprintf("node-%d", i%500),
		CanonicalName:     app,
		CanonicalRevision: "v1",
		WorkloadType:      workloadapi.WorkloadType_DEPLOYMENT,
		WorkloadName:      app,
		ClusterId:         "Kubernetes",
		Status:            workloadapi.WorkloadStatus_HEALTHY,
	}
}
