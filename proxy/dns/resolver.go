package dns

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/gozt/gozt/state"
)

// ttl is the TTL of every locally answered record (SPEC §10.1).
const ttl = 30

// Config configures a Resolver. Zero values mean the documented defaults.
type Config struct {
	// ClusterDomain is CLUSTER_DOMAIN; if empty "cluster.local".
	ClusterDomain string
	// PreferredNamespace is PREFERED_SERVICE_NAMESPACE: among services of
	// one hostname, one in this namespace wins over a non-canonical first.
	PreferredNamespace string
	// DisableIPv6 is IPV6_ENABLED=false: AAAA queries for mesh names get
	// no records.
	DisableIPv6 bool
	// SearchDomains, if non-nil, returns the search domains stripped from a
	// client's names (dedicated mode: the resolv.conf search list). If nil,
	// the Kubernetes defaults for the client's namespace are used, as
	// ztunnel does in shared mode: <ns>.svc.<domain>, svc.<domain>, <domain>.
	SearchDomains func(client *state.Workload) []string
	// Upstreams are the servers queries for other names are forwarded to
	// (resolv.conf's nameservers); none means such queries fail (SERVFAIL).
	Upstreams []netip.AddrPort
	// UpstreamTimeout bounds each query to one upstream; if zero 5s.
	UpstreamTimeout time.Duration
	// UpstreamAttempts is how many times the upstream list is tried; if
	// zero 2 (resolv.conf's timeout and attempts defaults).
	UpstreamAttempts int
	// Metrics records the istio_dns_* metrics. Required.
	Metrics *Metrics
	// Logger receives a DEBUG line per query (scope dns, SPEC §7.3). If
	// nil, logs are discarded.
	Logger *slog.Logger
}

// Resolver answers DNS queries for the workloads of a node: mesh service
// names from the state it is given, everything else from the upstream
// servers. It is shared by every workload's Server and safe for concurrent
// use.
type Resolver struct {
	cfg Config
	log *slog.Logger
}

// NewResolver returns a Resolver for cfg.
func NewResolver(cfg Config) *Resolver {
	if cfg.Metrics == nil {
		panic("dns: NewResolver needs Metrics")
	}
	if cfg.ClusterDomain == "" {
		cfg.ClusterDomain = "cluster.local"
	}
	cfg.ClusterDomain = strings.ToLower(strings.TrimSuffix(cfg.ClusterDomain, "."))
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Resolver{cfg: cfg, log: log}
}

func (r *Resolver) upstreamTimeout() time.Duration {
	if r.cfg.UpstreamTimeout > 0 {
		return r.cfg.UpstreamTimeout
	}
	return 5 * time.Second
}

func (r *Resolver) upstreamAttempts() int {
	if r.cfg.UpstreamAttempts > 0 {
		return r.cfg.UpstreamAttempts
	}
	return 2
}

func (r *Resolver) searchDomains(client *state.Workload) []string {
	if r.cfg.SearchDomains != nil {
		return r.cfg.SearchDomains(client)
	}
	d := r.cfg.ClusterDomain
	return []string{client.Namespace + ".svc." + d, "svc." + d, d}
}

// dialFunc makes a connected socket to an upstream server ("udp" or "tcp").
type dialFunc func(ctx context.Context, network string, addr netip.AddrPort) (net.Conn, error)

// query is one request being answered.
type query struct {
	snap   *state.Snapshot
	client *state.Workload // or nil when the source is unknown
	req    *dns.Msg
	proto  string // "udp" or "tcp"
	dial   dialFunc
}

// answer returns the response to q (SPEC §10.1). It never returns nil.
func (r *Resolver) answer(ctx context.Context, q query) *dns.Msg {
	req := q.req
	if resp := precheck(req); resp != nil {
		return resp
	}
	question := req.Question[0]
	labels := labelsFor(question.Qtype, q.proto, q.client)
	if q.client == nil {
		r.cfg.Metrics.request(labels)
		r.logQuery(q, "unknown source", 0)
		return errorReply(req, dns.RcodeServerFailure)
	}
	if question.Qtype != dns.TypeA && question.Qtype != dns.TypeAAAA {
		return r.forward(ctx, q, labels)
	}
	name := strings.ToLower(strings.TrimSuffix(question.Name, "."))
	m := &matcher{snap: q.snap, client: q.client, domain: r.cfg.ClusterDomain,
		search: r.searchDomains(q.client), preferred: r.cfg.PreferredNamespace}
	found, ok := m.find(name)
	if !ok {
		return r.forward(ctx, q, labels)
	}
	r.cfg.Metrics.request(labels)
	resp := reply(req)
	resp.Authoritative = true
	ipv6 := !r.cfg.DisableIPv6
	if !familyAllowed(found.svc, question.Qtype, ipv6) {
		r.logQuery(q, "service does not support this record type", 0)
		return resp
	}
	addrs := m.addresses(found, question.Qtype, ipv6)
	if len(addrs) == 0 {
		r.logQuery(q, "no records", 0)
		return resp
	}
	owner := name
	if found.alias.stripped != "" && !strings.HasPrefix(found.host, "*.") {
		owner = found.alias.stripped
		resp.Answer = append(resp.Answer, &dns.CNAME{Hdr: header(name, dns.TypeCNAME), Target: dns.Fqdn(owner)})
	}
	for _, a := range addrs {
		if a.Is4() {
			resp.Answer = append(resp.Answer, &dns.A{Hdr: header(owner, dns.TypeA), A: a.AsSlice()})
		} else {
			resp.Answer = append(resp.Answer, &dns.AAAA{Hdr: header(owner, dns.TypeAAAA), AAAA: a.AsSlice()})
		}
	}
	r.logQuery(q, "success", len(addrs))
	return resp
}

// precheck returns the error response to a message that is not a query
// the resolver answers, or nil: FORMERR for a response or a question count
// other than one, NOTIMP for an opcode other than QUERY. The listeners
// drop responses before they get here (isResponse); LookupIP sends none.
func precheck(req *dns.Msg) *dns.Msg {
	switch {
	case req.Response:
		return errorReply(req, dns.RcodeFormatError)
	case req.Opcode != dns.OpcodeQuery:
		return errorReply(req, dns.RcodeNotImplemented)
	case len(req.Question) != 1:
		return errorReply(req, dns.RcodeFormatError)
	}
	return nil
}

// header is the header of a record of type t for name (no trailing dot).
func header(name string, t uint16) dns.RR_Header {
	return dns.RR_Header{Name: dns.Fqdn(name), Rrtype: t, Class: dns.ClassINET, Ttl: ttl}
}

// reply returns an empty NOERROR response to req with recursion available,
// and an OPT record if req had one (payload at least 512, req's DO bit).
func reply(req *dns.Msg) *dns.Msg {
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.RecursionAvailable = true
	if opt := req.IsEdns0(); opt != nil {
		resp.SetEdns0(max(opt.UDPSize(), dns.MinMsgSize), opt.Do())
	}
	return resp
}

// errorReply returns a response to req with rcode and no records.
func errorReply(req *dns.Msg, rcode int) *dns.Msg {
	resp := reply(req)
	resp.Rcode = rcode
	return resp
}

// logQuery writes the DEBUG line of one query (SPEC §7.3).
func (r *Resolver) logQuery(q query, result string, endpoints int) {
	if !r.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	workload, namespace := unknown, unknown
	if q.client != nil {
		workload, namespace = q.client.Name, q.client.Namespace
	}
	question := q.req.Question[0]
	r.log.Debug("dns query",
		"src.workload", workload, "src.namespace", namespace,
		"query", dns.Type(question.Qtype).String(), "domain", strings.ToLower(question.Name),
		"result", result, "endpoints", endpoints)
}
