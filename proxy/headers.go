package proxy

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/state"
)

// CONNECT request headers (SPEC §2.3), as canonical http.Header keys, so
// that Set and Values need not canonicalize them (a new string each time);
// hbone sends them lower-cased.
const (
	headerBaggage     = "Baggage"
	headerForwarded   = "Forwarded"
	headerTraceparent = "Traceparent"
	// headerForwardedNetwork is the source's network, sent only on the
	// inner CONNECT of double HBONE (SPEC §2.3, §2.6).
	headerForwardedNetwork = "X-Forwarded-Network"
)

// baggage describes w for the peer's telemetry (SPEC §2.3): only non-empty
// items, in ztunnel's order.
func baggage(w *state.Workload) string {
	if w == nil {
		return ""
	}
	var b strings.Builder
	add := func(k, v string) {
		if v == "" {
			return
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(v)
	}
	add("k8s.cluster.name", w.ClusterID)
	add("k8s.namespace.name", w.Namespace)
	if w.WorkloadName != "" {
		add("k8s."+w.WorkloadType.String()+".name", w.WorkloadName)
	}
	add("service.name", w.CanonicalName)
	add("service.version", w.CanonicalRevision)
	add("cloud.region", w.Locality.Region)
	add("cloud.availability_zone", w.Locality.Zone)
	return b.String()
}

// forwarded builds the Forwarded header: for="<client ip:port>" and, when the
// connection targets a known service, ;host=<hostname> (SPEC §2.3).
func forwarded(client netip.AddrPort, svcHost string) string {
	s := `for="` + client.String() + `"`
	if svcHost != "" {
		s += ";host=" + svcHost
	}
	return s
}

// traceparent returns a fresh W3C traceparent with random ids and flags 00.
func traceparent() string {
	var id [24]byte
	_, _ = rand.Read(id[:])
	return "00-" + hex.EncodeToString(id[:16]) + "-" + hex.EncodeToString(id[16:]) + "-00"
}

// authority is a parsed CONNECT :authority (SPEC §2.4 step 2): either an IP
// target or a hostname target, always with a port.
type authority struct {
	addr netip.AddrPort // valid for IP targets
	host string         // non-empty for hostname targets
	port uint16
}

var errBadAuthority = errors.New("no valid authority")

// maxHostnameLen bounds hostname authorities (DNS names are at most 253 bytes).
const maxHostnameLen = 253

// parseAuthority parses a CONNECT :authority. IP targets are "ip:port" with
// IPv6 in brackets; anything else must be "hostname:port" with a DNS-style
// hostname. Port 0 and ports above 65535 are rejected.
func parseAuthority(s string) (authority, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		if ap.Port() == 0 || ap.Addr().Zone() != "" {
			return authority{}, errBadAuthority
		}
		return authority{addr: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), port: ap.Port()}, nil
	}
	host, portStr, err := net.SplitHostPort(s)
	if err != nil || host == "" || len(host) > maxHostnameLen || !validHostname(host) {
		return authority{}, errBadAuthority
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 || portStr[0] == '+' {
		return authority{}, errBadAuthority
	}
	return authority{host: host, port: uint16(port)}, nil
}

// validHostname reports whether h is made of DNS labels (letters, digits,
// '-', '_', separated by single dots). IP-looking strings are not hostnames.
func validHostname(h string) bool {
	if _, err := netip.ParseAddr(h); err == nil {
		return false
	}
	label := 0
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c == '.':
			if label == 0 {
				return false
			}
			label = 0
			continue
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return false
		}
		label++
		if label > 63 {
			return false
		}
	}
	return label > 0
}

func (a authority) String() string {
	if a.host != "" {
		return net.JoinHostPort(a.host, strconv.Itoa(int(a.port)))
	}
	return a.addr.String()
}

// forwardedHost returns the host= parameter of a Forwarded header (quotes
// stripped), or "" when absent or not plain ASCII. Only telemetry uses it;
// it never affects routing or authorization (TESTPLAN S8, S16).
func forwardedHost(h string) string {
	for _, elem := range strings.Split(h, ",") {
		for _, pair := range strings.Split(elem, ";") {
			k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
			if !ok || !strings.EqualFold(k, "host") {
				continue
			}
			v = strings.Trim(v, `"`)
			for i := 0; i < len(v); i++ {
				if v[i] < 0x21 || v[i] > 0x7e {
					return ""
				}
			}
			return v
		}
	}
	return ""
}

// derivedWorkload is what a peer's baggage says of a workload (ztunnel's
// DerivedWorkload): telemetry labels for a workload gozt cannot look up,
// the source behind an east-west gateway or the destination behind one.
type derivedWorkload struct {
	cluster, namespace, workloadName, service, revision, region, zone string
}

// maxBaggageValue bounds one baggage value gozt puts in a label. ztunnel
// takes any length; a Kubernetes name is at most 253 bytes, and a longer
// value is dropped rather than let one peer grow every series it touches.
const maxBaggageValue = 253

// parseBaggage reads the items of the baggage field values vs that name a
// workload, as ztunnel's parse_baggage_header does: items split on ',', an
// item's key and value on '=' (a value ends at a further '='), an empty value
// is none, keys are compared exactly (no spaces trimmed), unknown keys are
// ignored and a later item wins. A field with bytes outside visible ASCII
// makes the whole header say nothing, as a failed to_str does in ztunnel.
func parseBaggage(vs []string) derivedWorkload {
	var d derivedWorkload
	for _, v := range vs {
		for i := 0; i < len(v); i++ {
			if c := v[i]; (c < 0x20 || c > 0x7e) && c != '\t' {
				return derivedWorkload{}
			}
		}
	}
	for _, v := range vs {
		for item := range strings.SplitSeq(v, ",") {
			key, val, ok := strings.Cut(item, "=")
			if !ok {
				continue
			}
			val, _, _ = strings.Cut(val, "=")
			if len(val) > maxBaggageValue {
				val = ""
			}
			switch key {
			case "k8s.cluster.name":
				d.cluster = val
			case "k8s.namespace.name":
				d.namespace = val
			case "k8s.deployment.name", "k8s.cronjob.name", "k8s.pod.name", "k8s.job.name":
				d.workloadName = val
			case "service.name":
				d.service = val
			case "service.version":
				d.revision = val
			case "cloud.region":
				d.region = val
			case "cloud.availability_zone":
				d.zone = val
			}
		}
	}
	return d
}

// setDerivedSource sets l's source labels from the request's baggage, with
// principal the peer certificate's (ztunnel's with_derived_source), for a
// source that cannot be looked up (Labels.SetSource is used when it can).
// As in ztunnel, source_app is the baggage's workload name, not its service.
func setDerivedSource(l *telemetry.Labels, d derivedWorkload, principal string) {
	l.SrcWorkload = d.workloadName
	l.SrcCanonicalService, l.SrcCanonicalRevision = d.service, d.revision
	l.SrcNamespace = d.namespace
	l.SrcApp, l.SrcVersion = d.workloadName, d.revision
	l.SrcCluster = d.cluster
	l.SrcPrincipal = principal
	l.SrcRegion, l.SrcZone = d.region, d.zone
}

// setDerivedDestination sets every destination workload label of l from the
// destination's response baggage, with principal the peer certificate's
// (ztunnel's with_derived_destination, used for double HBONE, whose
// destination workload is behind a gateway).
func setDerivedDestination(l *telemetry.Labels, d derivedWorkload, principal string) {
	l.DstWorkload = d.workloadName
	l.DstCanonicalService, l.DstCanonicalRevision = d.service, d.revision
	l.DstNamespace = d.namespace
	l.DstApp, l.DstVersion = d.workloadName, d.revision
	l.DstCluster = d.cluster
	l.DstPrincipal = principal
	l.DstRegion, l.DstZone = d.region, d.zone
}
