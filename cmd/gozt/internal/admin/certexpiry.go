package admin

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/certs"
)

// certExpiryDesc is istio_cert_expiry_seconds, the name, label and meaning
// of ztunnel's open pull request for it (istio/ztunnel#1889, for #1748), so
// that an alert written for it, such as
// (istio_cert_expiry_seconds - time()) < 7200, works on gozt.
var certExpiryDesc = prometheus.NewDesc("istio_cert_expiry_seconds", certExpiryHelp, []string{"identity"}, nil)

const certExpiryHelp = "The Unix time at which the workload certificate of identity expires (gozt; ztunnel has it only in an open pull request)"

// certExpiry collects istio_cert_expiry_seconds from the certificates a
// manager holds at each scrape: one series per identity with a
// certificate, set to its leaf's NotAfter. Read at scrape time, the value
// moves with every rotation and an identity the manager forgets leaves the
// scrape with it; nothing is kept between scrapes.
type certExpiry struct {
	states func() []certs.State
}

// NewCertExpiry returns the collector of istio_cert_expiry_seconds over the
// certificates states lists (certs.Manager.States).
func NewCertExpiry(states func() []certs.State) prometheus.Collector {
	return certExpiry{states: states}
}

func (c certExpiry) Describe(ch chan<- *prometheus.Desc) { ch <- certExpiryDesc }

func (c certExpiry) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.states() {
		if st.Cert == nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(certExpiryDesc, prometheus.GaugeValue,
			float64(st.Cert.NotAfter().Unix()), st.Identity.String())
	}
}
