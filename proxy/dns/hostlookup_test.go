package dns

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/miekg/dns"

	"github.com/gozt/gozt/internal/dnstest"
)

// zone is a test authoritative server: fixed records per name, NXDOMAIN
// (with an SOA when soa is set) for others, and a count of every question.
type zone struct {
	addr    netip.AddrPort
	records map[string][]dns.RR // by "NAME TYPE", e.g. "db.example. A"
	soa     bool
	fail    map[string]bool // names answered SERVFAIL

	questions // by "NAME TYPE"
}

// answer is z's handler: it counts the question and answers from the records.
func (z *zone) answer(w dns.ResponseWriter, req *dns.Msg) {
	q := req.Question[0]
	key := q.Name + " " + dns.TypeToString[q.Qtype]
	z.ask(key)
	resp := new(dns.Msg)
	resp.SetReply(req)
	switch {
	case z.fail[q.Name]:
		resp.Rcode = dns.RcodeServerFailure
	case z.records[key] != nil:
		resp.Answer = z.records[key]
	default:
		known := false
		for k := range z.records {
			known = known || strings.HasPrefix(k, q.Name+" ")
		}
		if !known {
			resp.Rcode = dns.RcodeNameError
		}
		if z.soa {
			resp.Ns = []dns.RR{&dns.SOA{Hdr: dns.RR_Header{Name: "example.", Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 300},
				Ns: "ns.example.", Mbox: "admin.example.", Serial: 1, Minttl: 30}}
		}
	}
	w.WriteMsg(resp)
}

// startZone serves z over UDP on ip until the test ends.
func startZone(t testing.TB, ip string, z *zone) *zone {
	t.Helper()
	pc, err := net.ListenPacket("udp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	z.addr = netip.MustParseAddrPort(pc.LocalAddr().String())
	dnstest.Serve(t, &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(z.answer)})
	return z
}

func a(name string, ttl uint32, ip string) dns.RR {
	return &dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ttl}, A: net.ParseIP(ip)}
}

func aaaa(name string, ttl uint32, ip string) dns.RR {
	return &dns.AAAA{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: ttl}, AAAA: net.ParseIP(ip)}
}

func sortedAddrs(addrs []netip.Addr) []string {
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.String()
	}
	slices.Sort(out)
	return out
}

// TestHostResolverFamilies: A and AAAA are both queried and joined; with
// IPv4Only only A is asked; an IP literal is returned without a query.
func TestHostResolverFamilies(t *testing.T) {
	z := startZone(t, "127.89.201.1", &zone{records: map[string][]dns.RR{
		"dual.example. A":    {a("dual.example.", 60, "192.0.2.1"), a("dual.example.", 60, "192.0.2.2")},
		"dual.example. AAAA": {aaaa("dual.example.", 60, "2001:db8::1")},
		"v6.example. AAAA":   {aaaa("v6.example.", 60, "2001:db8::6")},
	}})
	ctx := context.Background()
	for _, tc := range []struct {
		host     string
		ipv4Only bool
		want     []string
		wantErr  bool
	}{
		{host: "dual.example", want: []string{"192.0.2.1", "192.0.2.2", "2001:db8::1"}},
		{host: "dual.example", ipv4Only: true, want: []string{"192.0.2.1", "192.0.2.2"}},
		{host: "v6.example", want: []string{"2001:db8::6"}},
		{host: "v6.example", ipv4Only: true, wantErr: true},
		{host: "192.0.2.9", want: []string{"192.0.2.9"}},
		{host: "missing.example", wantErr: true},
	} {
		h := NewHostResolver(HostConfig{Servers: []netip.AddrPort{z.addr}, Ndots: 1, IPv4Only: tc.ipv4Only})
		got, err := h.LookupHost(ctx, tc.host)
		if tc.wantErr {
			if err == nil || !errors.Is(err, errNoRecords) {
				t.Errorf("LookupHost(%s, ipv4Only=%v) = %v, %v; want %v", tc.host, tc.ipv4Only, got, err, errNoRecords)
			}
			continue
		}
		if err != nil {
			t.Fatalf("LookupHost(%s): %v", tc.host, err)
		}
		if diff := cmp.Diff(tc.want, sortedAddrs(got)); diff != "" {
			t.Errorf("LookupHost(%s, ipv4Only=%v) (-want +got):\n%s", tc.host, tc.ipv4Only, diff)
		}
	}
	if n := z.count("v6.example. AAAA"); n != 1 {
		t.Errorf("AAAA queries for v6.example = %d, want 1 (none with IPv4Only)", n)
	}
}

// TestHostResolverSearch: the search list and ndots order the candidate
// names as hickory does.
func TestHostResolverSearch(t *testing.T) {
	h := NewHostResolver(HostConfig{Search: []string{"ns.svc.cluster.local", "cluster.local"}, Ndots: 2})
	for _, tc := range []struct {
		host string
		want []string
	}{
		{"db", []string{"db.ns.svc.cluster.local.", "db.cluster.local.", "db."}},
		{"db.example", []string{"db.example.ns.svc.cluster.local.", "db.example.cluster.local.", "db.example."}},
		{"api.db.example", []string{"api.db.example.", "api.db.example.ns.svc.cluster.local.", "api.db.example.cluster.local."}},
		{"db.example.", []string{"db.example."}},
		{"localhost", []string{"localhost.", "localhost.ns.svc.cluster.local.", "localhost.cluster.local."}},
	} {
		if diff := cmp.Diff(tc.want, h.names(tc.host)); diff != "" {
			t.Errorf("names(%s) (-want +got):\n%s", tc.host, diff)
		}
	}

	// A name found only under a search domain, over the wire.
	z := startZone(t, "127.89.201.2", &zone{records: map[string][]dns.RR{
		"db.ns.svc.cluster.local. A": {a("db.ns.svc.cluster.local.", 60, "192.0.2.7")},
	}})
	h = NewHostResolver(HostConfig{Servers: []netip.AddrPort{z.addr}, Search: []string{"cluster.local", "ns.svc.cluster.local"}, Ndots: 1})
	got, err := h.LookupHost(context.Background(), "db")
	if err != nil || len(got) != 1 || got[0].String() != "192.0.2.7" {
		t.Fatalf("LookupHost(db) = %v, %v; want 192.0.2.7", got, err)
	}
	if z.count("db.cluster.local. A") != 1 || z.count("db. A") != 0 {
		t.Errorf("queries = %v; want db.cluster.local first, db. never", z.seen)
	}
}

// TestHostResolverCache: a positive answer is reused until its smallest
// TTL passes; NXDOMAIN is cached for the SOA's negative TTL, and not at all
// without an SOA; a SERVFAIL is never cached.
func TestHostResolverCache(t *testing.T) {
	z := startZone(t, "127.89.201.3", &zone{soa: true, fail: map[string]bool{"broken.example.": true},
		records: map[string][]dns.RR{
			"short.example. A": {a("short.example.", 10, "192.0.2.1"), a("short.example.", 5, "192.0.2.2")},
		}})
	now := time.Unix(1_000_000, 0)
	h := NewHostResolver(HostConfig{Servers: []netip.AddrPort{z.addr}, Ndots: 1, IPv4Only: true, Attempts: 1})
	h.now = func() time.Time { return now }
	ctx := context.Background()
	lookup := func(host string) error {
		_, err := h.LookupHost(ctx, host)
		return err
	}
	for _, step := range []struct {
		advance time.Duration
		host    string
		wantErr bool
		key     string
		queries int
	}{
		{0, "short.example", false, "short.example. A", 1},
		{4 * time.Second, "short.example", false, "short.example. A", 1}, // within the 5s TTL
		{2 * time.Second, "short.example", false, "short.example. A", 2}, // past it
		{0, "gone.example", true, "gone.example. A", 1},
		{29 * time.Second, "gone.example", true, "gone.example. A", 1}, // SOA minimum 30s
		{2 * time.Second, "gone.example", true, "gone.example. A", 2},
		{0, "broken.example", true, "broken.example. A", 1},
		{0, "broken.example", true, "broken.example. A", 2},
	} {
		now = now.Add(step.advance)
		if err := lookup(step.host); (err != nil) != step.wantErr {
			t.Fatalf("LookupHost(%s) after +%v: error %v, want error %v", step.host, step.advance, err, step.wantErr)
		}
		if n := z.count(step.key); n != step.queries {
			t.Errorf("after +%v: %d queries for %s, want %d", step.advance, n, step.key, step.queries)
		}
	}

	z = startZone(t, "127.89.201.5", &zone{})
	h = NewHostResolver(HostConfig{Servers: []netip.AddrPort{z.addr}, Ndots: 1, IPv4Only: true})
	for range 2 {
		lookup("nosoa.example")
	}
	if n := z.count("nosoa.example. A"); n != 2 {
		t.Errorf("NXDOMAIN without SOA queried %d times for 2 lookups, want 2 (not cached)", n)
	}
}

// TestReadHostConfig reads servers, search list and ndots from a file.
func TestReadHostConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(path, []byte("nameserver 127.89.201.4\nsearch a.example B.example.\noptions ndots:5 timeout:3 attempts:4\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ReadHostConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	want := HostConfig{Servers: []netip.AddrPort{netip.MustParseAddrPort("127.89.201.4:53")},
		Search: []string{"a.example", "b.example"}, Ndots: 5, Timeout: 3 * time.Second, Attempts: 4}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
		t.Errorf("ReadHostConfig (-want +got):\n%s", diff)
	}
}
