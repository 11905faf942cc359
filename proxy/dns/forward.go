package dns

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/miekg/dns"
)

// errNoUpstream is the failure of a forward with no upstream configured.
var errNoUpstream = errors.New("no upstream DNS server configured")

// forward answers q from the upstream servers (SPEC §10.1): the query goes
// out as it came, with a fresh ID, from a socket dial makes (in shared mode
// inside the pod's network namespace, with the mark). The answer is
// ztunnel's: not authoritative, recursion available, the upstream's answer
// and additional records, or only its response code when it has no answer
// (NXDOMAIN, or NOERROR without records). An upstream that fails or times
// out on every attempt gives SERVFAIL.
//
// As in ztunnel (whose upstream resolver reports an empty or NXDOMAIN
// answer as an error), every forward without answer records counts in
// istio_dns_upstream_failures_total.
func (r *Resolver) forward(ctx context.Context, q query, l labels) *dns.Msg {
	r.cfg.Metrics.request(l)
	start := time.Now()
	up, err := r.exchangeAll(ctx, q)
	failed := err != nil || up.Rcode != dns.RcodeSuccess || len(up.Answer) == 0
	r.cfg.Metrics.forwarded(l, time.Since(start), failed)
	if err != nil {
		r.logQuery(q, fmt.Sprintf("forwarding failed (%v)", err), 0)
		return errorReply(q.req, dns.RcodeServerFailure)
	}
	resp := reply(q.req)
	if up.Rcode != dns.RcodeSuccess || len(up.Answer) == 0 {
		resp.Rcode = up.Rcode
	} else {
		resp.Answer = up.Answer
		for _, rr := range up.Extra {
			if rr.Header().Rrtype != dns.TypeOPT {
				resp.Extra = append(resp.Extra, rr)
			}
		}
	}
	r.logQuery(q, "forwarded", len(resp.Answer))
	return resp
}

// exchangeAll tries each upstream in turn, the whole list up to
// upstreamAttempts times, and returns the first response that is neither
// SERVFAIL nor REFUSED.
func (r *Resolver) exchangeAll(ctx context.Context, q query) (*dns.Msg, error) {
	if len(r.cfg.Upstreams) == 0 {
		return nil, errNoUpstream
	}
	var last error
	for range r.upstreamAttempts() {
		for _, addr := range r.cfg.Upstreams {
			resp, err := r.exchange(ctx, q, addr)
			switch {
			case err != nil:
				last = err
			case resp.Rcode == dns.RcodeServerFailure || resp.Rcode == dns.RcodeRefused:
				last = fmt.Errorf("upstream %v answered %s", addr, dns.RcodeToString[resp.Rcode])
			default:
				return resp, nil
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
		}
	}
	return nil, last
}

// exchange sends q's request to one upstream over UDP, and again over TCP
// if the UDP answer is truncated.
func (r *Resolver) exchange(ctx context.Context, q query, addr netip.AddrPort) (*dns.Msg, error) {
	resp, err := r.exchangeOver(ctx, "udp", q, addr)
	if err == nil && resp.Truncated {
		resp, err = r.exchangeOver(ctx, "tcp", q, addr)
	}
	return resp, err
}

// exchangeOver makes one exchange with addr over network, bounded by the
// upstream timeout and by ctx.
func (r *Resolver) exchangeOver(ctx context.Context, network string, q query, addr netip.AddrPort) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, r.upstreamTimeout())
	defer cancel()
	conn, err := q.dial(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s %v: %w", network, addr, err)
	}
	defer conn.Close()
	// A cancelled ctx (shutdown) ends a read in progress.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	out := q.req.Copy()
	out.Id = dns.Id()
	c := &dns.Client{Net: network, Timeout: r.upstreamTimeout()}
	resp, _, err := c.ExchangeWithConnContext(ctx, out, &dns.Conn{Conn: conn})
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		return nil, fmt.Errorf("exchange with %s %v: %w", network, addr, err)
	}
	resp.Id = q.req.Id
	return resp, nil
}
