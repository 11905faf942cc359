package telemetry

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/state"
)

// This file counts, in istio_on_demand_dns_total, the lookups of endpoint
// hostnames at connect time (SPEC §3.3, §7.1).

// onDemandDNSLabelNames are the labels of istio_on_demand_dns_total, in
// ztunnel's order (SPEC §7.1): the source workload and the hostname.
var onDemandDNSLabelNames = []string{
	"source_workload", "source_canonical_service", "source_canonical_revision",
	"source_workload_namespace", "source_principal", "source_app", "source_version", "source_cluster",
	"hostname",
}

// onDemandDNSLabels are the label values of one on-demand lookup (STYLE 40).
type onDemandDNSLabels struct {
	srcWorkload, srcCanonicalService, srcCanonicalRevision, srcNamespace string
	srcPrincipal, srcApp, srcVersion, srcCluster                         string
	hostname                                                             string
}

func (l *onDemandDNSLabels) values() []string {
	v := []string{
		l.srcWorkload, l.srcCanonicalService, l.srcCanonicalRevision, l.srcNamespace,
		l.srcPrincipal, l.srcApp, l.srcVersion, l.srcCluster, l.hostname,
	}
	for i := range v {
		v[i] = orUnknown(v[i])
	}
	return v
}

// newOnDemandDNS registers istio_on_demand_dns_total with reg. Its series
// with every label empty exists from the start at 0, for the reason
// seedEmptySeries gives; no lookup lands in it (values maps empty to
// "unknown").
func newOnDemandDNS(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "istio_on_demand_dns_total",
		Help: "The total number of requests that used on-demand DNS (unstable)",
	}, onDemandDNSLabelNames)
	reg.MustRegister(c)
	c.WithLabelValues(make([]string, len(onDemandDNSLabelNames))...)
	return c
}

// CountOnDemandDNS counts one on-demand lookup of hostname for src: the
// source labels as ztunnel's OnDemandDnsLabels takes them (the principal
// is src's own identity; the workload name as the traffic metrics take it).
func (m *Metrics) CountOnDemandDNS(src *state.Workload, hostname string) {
	l := onDemandDNSLabels{
		srcWorkload:          workloadName(src),
		srcCanonicalService:  src.CanonicalName,
		srcCanonicalRevision: src.CanonicalRevision,
		srcNamespace:         src.Namespace,
		srcPrincipal:         Principal(src.Identity()),
		srcApp:               src.CanonicalName,
		srcVersion:           src.CanonicalRevision,
		srcCluster:           src.ClusterID,
		hostname:             hostname,
	}
	m.onDemandDNS.WithLabelValues(l.values()...).Inc()
}
