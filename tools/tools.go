//go:build tools

// Package tools pins build-time tools and the dependencies chosen in DESIGN.md
// so that `go mod tidy` keeps them.
package tools

import (
	_ "github.com/google/go-cmp/cmp"
	_ "github.com/spiffe/go-spiffe/v2/svid/x509svid"
	_ "go.uber.org/goleak"
	_ "golang.org/x/net/http2"
	_ "golang.org/x/net/http2/hpack"
	_ "golang.org/x/sys/unix"
	_ "gopkg.in/yaml.v3"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "golang.org/x/sync/errgroup"
)
