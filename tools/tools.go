//go:build tools

// Package tools pins build-time tools and the dependencies chosen in DESIGN.md
// so that `go mod tidy` keeps them.
package tools

import (
	_ "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	_ "github.com/google/go-cmp/cmp"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "go.uber.org/goleak"
	_ "golang.org/x/net/http2"
	_ "golang.org/x/net/http2/hpack"
	_ "golang.org/x/sync/errgroup"
	_ "golang.org/x/sys/unix"
	_ "google.golang.org/grpc"
	_ "gopkg.in/yaml.v3"
	_ "istio.io/api/security/v1alpha1"
	_ "istio.io/istio/pkg/workloadapi"
	_ "istio.io/istio/pkg/workloadapi/security"
	_ "istio.io/istio/pkg/zdsapi"
)
