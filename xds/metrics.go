package xds

import (
	"errors"
	"fmt"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
)

// terminationReason labels istio_xds_connection_terminations_total (SPEC
// §7.2) with ztunnel's spelling.
type terminationReason string

const (
	// reasonConnectionError: the stream could not be opened (dial, TLS,
	// token).
	reasonConnectionError terminationReason = "ConnectionError"
	// reasonError: the stream failed with an unexpected gRPC error.
	reasonError terminationReason = "Error"
	// reasonReconnect: the stream ended with a benign gRPC error (server
	// restart, GOAWAY, max connection age).
	reasonReconnect terminationReason = "Reconnect"
	// reasonComplete: the server ended the stream with status OK.
	reasonComplete terminationReason = "Complete"
)

// clientMetrics are the xDS client's counters (SPEC §7.2). A nil
// *clientMetrics records nothing.
type clientMetrics struct {
	terminations *prometheus.CounterVec // label reason
	messages     *prometheus.CounterVec // label url
	bytes        *prometheus.CounterVec // label url
}

// RegisterMetrics registers the xDS counters of SPEC §7.2 with reg, every
// known label value at 0: the four termination reasons and both subscribed
// type URLs, so that a dashboard reads 0 rather than "No data" before (or
// without) an xDS stream. A process without an xDS client (gozt local, or
// no XDS_ADDRESS) calls it at start-up; a Client registering with the same
// reg later reuses these counters, so calling it first is never a
// duplicate.
func RegisterMetrics(reg prometheus.Registerer) error {
	_, err := newClientMetrics(reg)
	return err
}

// newClientMetrics registers the counters with reg, reusing counters that
// an earlier client (or RegisterMetrics) registered there, and creates
// every known series at 0. A nil reg gives nil metrics.
func newClientMetrics(reg prometheus.Registerer) (*clientMetrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &clientMetrics{}
	var err error
	if m.terminations, err = registerCounterVec(reg, prometheus.CounterOpts{
		Name: "istio_xds_connection_terminations_total",
		Help: "Number of xDS streams that ended, by reason.",
	}, "reason"); err != nil {
		return nil, err
	}
	if m.messages, err = registerCounterVec(reg, prometheus.CounterOpts{
		Name: "istio_xds_message_total",
		Help: "Number of xDS responses received, by type URL.",
	}, "url"); err != nil {
		return nil, err
	}
	if m.bytes, err = registerCounterVec(reg, prometheus.CounterOpts{
		Name: "istio_xds_message_bytes_total",
		Help: "Bytes of resource payload received over xDS, by type URL.",
	}, "url"); err != nil {
		return nil, err
	}
	for _, r := range []terminationReason{reasonConnectionError, reasonError, reasonReconnect, reasonComplete} {
		m.terminations.WithLabelValues(string(r))
	}
	for _, url := range subscribedTypes {
		m.messages.WithLabelValues(url)
		m.bytes.WithLabelValues(url)
	}
	return m, nil
}

func registerCounterVec(reg prometheus.Registerer, opts prometheus.CounterOpts, label string) (*prometheus.CounterVec, error) {
	cv := prometheus.NewCounterVec(opts, []string{label})
	err := reg.Register(cv)
	if err == nil {
		return cv, nil
	}
	if are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok {
		if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
			return existing, nil
		}
	}
	return nil, fmt.Errorf("xds: register %s: %w", opts.Name, err)
}

func (m *clientMetrics) terminated(r terminationReason) {
	if m == nil {
		return
	}
	m.terminations.WithLabelValues(string(r)).Inc()
}

// received counts one response and the size of its resources' payloads.
func (m *clientMetrics) received(resp *discoveryv3.DeltaDiscoveryResponse) {
	if m == nil {
		return
	}
	url := resp.GetTypeUrl()
	if url != AddressTypeURL && url != AuthorizationTypeURL {
		url = "unknown" // the server chooses type URLs: bound the label set
	}
	m.messages.WithLabelValues(url).Inc()
	n := 0
	for _, r := range resp.GetResources() {
		n += len(r.GetResource().GetValue())
	}
	m.bytes.WithLabelValues(url).Add(float64(n))
}
