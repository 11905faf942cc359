package local

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	xproxy "golang.org/x/net/proxy"

	"github.com/gozt/gozt/certs/certstest"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/hbone"
	"github.com/gozt/gozt/hbone/hbonetest"
	"github.com/gozt/gozt/state"
)

// TestBadInputs runs TESTPLAN §5.1 items 1–37 (HBONE/HTTP-2 and TLS bad
// inputs) end to end against one running gozt local mesh: each bad input
// goes over real mTLS (or real TCP, for the TLS cases) to the server
// workload's 15008, the outcome the TESTPLAN names is asserted, and a
// canary HBONE connection on the same gozt streams bytes through the mesh
// during the case and must come out of it open, error-free and intact.
// Many of these are also unit tests in hbone (hostile_test.go,
// conform_test.go, refuse_test.go); here they go through the whole proxy.
//
// The cases share the mesh on purpose: the process must survive all of
// them. The slow ones (timers of 10–30 s) run in parallel with the rest.
func TestBadInputs(t *testing.T) {
	e := startBadEnv(t)
	var mu sync.Mutex
	var rows []string
	run := func(t *testing.T, i int, c badCase) {
		cn := e.startCanary(t, uint64(1000+i))
		observed := c.run(t, e)
		st := cn.check(t)
		mu.Lock()
		rows = append(rows, fmt.Sprintf("| %s | %s | %s | ok (%d KiB echoed intact) |", c.item, c.sent, observed, st.bytes>>10))
		mu.Unlock()
	}
	t.Run("cases", func(t *testing.T) {
		t.Run("slow", func(t *testing.T) {
			t.Parallel()
			for i, c := range badCases {
				if c.slow {
					t.Run(c.item+"/"+c.name, func(t *testing.T) {
						t.Parallel()
						run(t, i, c)
					})
				}
			}
		})
		t.Run("fast", func(t *testing.T) {
			t.Parallel()
			for i, c := range badCases {
				if !c.slow {
					t.Run(c.item+"/"+c.name, func(t *testing.T) { run(t, i, c) })
				}
			}
		})
	})
	// Item 37 (CRL revokes a peer: new handshakes refused, live tunnels
	// torn down) runs against two `gozt proxy` nodes sharing a CRL file:
	// cmd/gozt/internal/node TestCRLRevokesLiveAndNewTunnels.
	mu.Lock()
	t.Logf("bad inputs:\n| # | sent | observed | canary |\n|---|---|---|---|\n%s", strings.Join(rows, "\n"))
	mu.Unlock()
}

// badCase is one TESTPLAN bad input. run drives it, asserts the expected
// outcome and returns what it observed, for the table.
type badCase struct {
	item, name string
	sent       string
	slow       bool // runs in parallel with the other cases
	run        func(t *testing.T, e *badEnv) string
}

var badCases = []badCase{
	{item: "1", name: "non-CONNECT", sent: "GET and POST (with a body) to server:8080", run: caseNonConnect},
	{item: "2", name: "no authority", sent: "CONNECT without :authority", run: func(t *testing.T, e *badEnv) string {
		p := e.peer(t)
		a0 := e.target.accepts.Load()
		p.Headers(1, false, ":method", "CONNECT")
		p.WantRST(1, http2.ErrCodeProtocol)
		e.followUp(t, p, 3)
		badNoDial(t, e.target, a0)
		return "RST_STREAM PROTOCOL_ERROR; no dial; connection serves the next tunnel"
	}},
	{item: "3", name: "bad authority", sent: "`:authority` server (no port), :0, :65536, :http, :+80, :-1, [::1]", run: func(t *testing.T, e *badEnv) string {
		s := e.tm.ips.Server
		return badStatusCases(t, e, e.target, "400", s, s+":0", s+":65536", s+":http", s+":+80", s+":-1", "[::1]")
	}},
	{item: "4", name: "ip mismatch", sent: "`:authority` client-IP:8080 on the server's 15008", run: func(t *testing.T, e *badEnv) string {
		return badStatusCases(t, e, e.mismatch, "400", net.JoinHostPort(e.tm.ips.Client, badTargetPort))
	}},
	{item: "5", name: "loop protection", sent: "`:authority` 127.0.0.1:<listening port>, 127.0.0.1:<admin port>, [::1]:15000, 169.254.169.254:80; server:15001/15006/15008/15080", run: caseLoop},
	{item: "6", name: "hostnames", sent: "unknown mesh hostname; 60 KiB hostname; 64 KiB :authority", run: caseHostnames},
	{item: "7", name: "connect pseudo-headers", sent: "CONNECT with :scheme, with :path, extended CONNECT :protocol", run: func(t *testing.T, e *badEnv) string {
		a := e.server(badTargetPort)
		return badResetCases(t, e, http2.ErrCodeProtocol,
			[]string{":method", "CONNECT", ":authority", a, ":scheme", "https"},
			[]string{":method", "CONNECT", ":authority", a, ":path", "/"},
			[]string{":method", "CONNECT", ":protocol", "websocket", ":scheme", "https", ":path", "/", ":authority", a},
		)
	}},
	{item: "8", name: "malformed fields", sent: "duplicate :method, pseudo after regular, uppercase name, connection/keep-alive/proxy-connection/transfer-encoding/upgrade, te: gzip", run: func(t *testing.T, e *badEnv) string {
		a := e.server(badTargetPort)
		c := []string{":method", "CONNECT", ":authority", a}
		return badResetCases(t, e, http2.ErrCodeProtocol,
			[]string{":method", "CONNECT", ":method", "CONNECT", ":authority", a},
			[]string{":method", "CONNECT", "x", "y", ":authority", a},
			append(c[:4:4], "X-Upper", "v"),
			append(c[:4:4], "connection", "close"),
			append(c[:4:4], "keep-alive", "timeout=5"),
			append(c[:4:4], "proxy-connection", "keep-alive"),
			append(c[:4:4], "transfer-encoding", "chunked"),
			append(c[:4:4], "upgrade", "h2c"),
			append(c[:4:4], "te", "gzip"),
		)
	}},
	{item: "9", name: "header list too large", sent: "CONNECT with 80 × 1000-byte fields (≈80 KiB decoded) in HEADERS+CONTINUATION", run: func(t *testing.T, e *badEnv) string {
		p := e.peer(t)
		a0 := e.target.accepts.Load()
		fields := []string{":method", "CONNECT", ":authority", e.server(badTargetPort)}
		for i := range 80 {
			fields = append(fields, fmt.Sprintf("x-h%d", i), strings.Repeat("v", 1000))
		}
		p.WriteBlock(1, false, p.Block(fields...))
		p.WantStatus(1, "431")
		p.WantRST(1, http2.ErrCodeNo)
		e.followUp(t, p, 3)
		badNoDial(t, e.target, a0)
		return "HEADERS :status 431, RST_STREAM NO_ERROR; no dial; connection serves the next tunnel"
	}},
	{item: "10", name: "continuation flood", sent: "HEADERS without END_HEADERS, then up to 100 000 CONTINUATION (empty and 1000-byte)", run: caseContinuationFlood},
	{item: "11", name: "hpack amplification", sent: "4 KiB field indexed 100× (≈4.6 KiB encoded, 400 KiB decoded); 10 000 indexed cookie crumbs", run: caseHPACKBomb},
	{item: "12", name: "malformed hpack", sent: "bad Huffman padding; dynamic table size update 8192 > SETTINGS 4096", run: caseBadHPACK},
	// Item 13 asks for 10k/s for 30 s; bounded here (3000 streams) since
	// the server's limit (1000 peer resets per 10 s) trips long before.
	{item: "13", name: "rapid reset", sent: "up to 3000 × (HEADERS CONNECT server:8080 + RST_STREAM CANCEL)", run: caseRapidReset},
	{item: "14", name: "made you reset", sent: "CONNECT + WINDOW_UPDATE 0 on each stream (up to 2000); DATA flood on reset streams", run: caseMadeYouReset},
	{item: "15", name: "max concurrent streams", sent: "210 concurrent CONNECTs (limit 200) held open", run: caseMaxStreams},
	{item: "16", name: "settings flood", sent: "up to 1000 SETTINGS frames", run: badFloodCase(func(p *hbonetest.Peer) error { return p.Framer.WriteSettings() })},
	{item: "17", name: "ping flood", sent: "up to 1000 PING frames", run: badFloodCase(func(p *hbonetest.Peer) error { return p.Framer.WritePing(false, [8]byte{1}) })},
	{item: "18", name: "empty frames", sent: "up to 1000 empty DATA on an open tunnel; up to 1000 empty HEADERS (new streams)", run: caseEmptyFrames},
	{item: "19", name: "window overflow", sent: "WINDOW_UPDATE 2^31−1 on an open stream; on the connection", run: caseWindowOverflow},
	{item: "20", name: "client never reads", sent: "tunnel to a backend that writes without end, never given window; a second tunnel on the same connection echoes 1 MiB", run: caseNeverReads},
	// Item 21: gozt sets a 10 s TLS handshake deadline on 15008
	// (proxy.handshakeTimeout) where ztunnel has none of its own; the case
	// asserts that every slow connection is closed by the server and that a
	// legitimate client is served meanwhile, not how long either took.
	{item: "21", name: "slowloris", sent: "50 TCP conns silent + 50 trickling a ClientHello 1 byte/s; a legit client meanwhile", slow: true, run: caseSlowloris},
	{item: "22", name: "no preface", sent: "mTLS done, no HTTP/2 preface", slow: true, run: func(t *testing.T, e *badEnv) string {
		p := dialH2Peer(t, e.tm.ips.Client, e.server("15008"), e.tm.clientTLS(t))
		start := time.Now()
		seen := badCollectUntilClosed(t, p)
		return fmt.Sprintf("server closed the connection after %v (preface timeout 10 s); frames seen: %s", time.Since(start).Round(time.Second), seen)
	}},
	// Item 22's idle timeout (10 min without a stream, for a peer that does
	// answer PINGs) is too long here; hbone's TestServerIdleTimeout covers it.
	{item: "22", name: "no stream, pings unanswered", sent: "preface + SETTINGS, then nothing: no stream, PINGs never acknowledged", slow: true, run: func(t *testing.T, e *badEnv) string {
		p := e.peer(t)
		start := time.Now()
		seen := badCollectUntilClosed(t, p)
		if !strings.Contains(seen, "PING") {
			t.Errorf("closed without a PING first: %s", seen)
		}
		return fmt.Sprintf("server closed the connection after %v (PING 10 s, timeout 20 s); frames seen: %s", time.Since(start).Round(time.Second), seen)
	}},
	{item: "23", name: "early data to denied target", sent: "CONNECT server:8081 (DENY policy) + DATA right after HEADERS", run: caseEarlyData},
	{item: "24", name: "client goaway mid-stream", sent: "GOAWAY from the client while a tunnel is open, then more DATA and END_STREAM", run: caseClientGoAway},
	{item: "24", name: "destination goaway", sent: "outbound: the destination's HBONE server sends GOAWAY with a tunnel in flight; then a new connection", run: caseDestGoAway},
	{item: "25", name: "not tls", sent: "HTTP/1.1 request, h2c prior-knowledge preface, 1 KiB random bytes to 15008", run: caseNotTLS},
	// Items 26 and 27 are fuzzing at unit level (hbone/fuzz_test.go and the
	// header parsers' fuzz targets); end to end, a handful of hostile values
	// and seeded random frames must leave the proxy serving.
	{item: "26", name: "hostile headers", sent: "CONNECT with Forwarded for=1.2.3.4, X-Forwarded-For, junk baggage/traceparent/x-forwarded-network; and to the denied port", run: caseHostileHeaders},
	{item: "27", name: "random frames", sent: "20 connections × up to 100 seeded random frames (types 0–15, random flags, stream 0–7, payload ≤ 63 B)", run: caseRandomFrames},
	{item: "28", name: "no client cert", sent: "TLS 1.3 + h2, no certificate", run: func(t *testing.T, e *badEnv) string {
		return badTLSCases(t, e, badTLSTry{"no certificate", badClientTLS(nil, nil), false})
	}},
	{item: "29", name: "untrusted root", sent: "client SVID from a CA the mesh does not trust", run: func(t *testing.T, e *badEnv) string {
		rootDER, rootKey := badMint(t, badCATemplate("other root"), nil, nil)
		leaf, key := badMint(t, certstest.LeafTemplate(t, clientID.String()), badParseCert(t, rootDER), rootKey)
		return badTLSCases(t, e,
			badTLSTry{"untrusted leaf", badClientTLS([][]byte{leaf}, key), false},
			badTLSTry{"untrusted leaf + its root", badClientTLS([][]byte{leaf, rootDER}, key), false})
	}},
	{item: "30", name: "validity", sent: "client SVID expired 1 h ago; valid from 1 h ahead", run: func(t *testing.T, e *badEnv) string {
		now := time.Now()
		exp := certstest.LeafTemplate(t, clientID.String())
		exp.NotBefore, exp.NotAfter = now.Add(-2*time.Hour), now.Add(-time.Hour)
		fut := certstest.LeafTemplate(t, clientID.String())
		fut.NotBefore, fut.NotAfter = now.Add(time.Hour), now.Add(2*time.Hour)
		return badTLSCases(t, e, e.meshLeaf(t, "expired", exp, false), e.meshLeaf(t, "not yet valid", fut, false))
	}},
	{item: "31", name: "trust domain", sent: "client SVID spiffe://evil.local/ns/demo/sa/client from the mesh CA", run: func(t *testing.T, e *badEnv) string {
		return badTLSCases(t, e, e.meshLeaf(t, "wrong trust domain", certstest.LeafTemplate(t, "spiffe://evil.local/ns/demo/sa/client"), false))
	}},
	{item: "32", name: "spiffe sans", sent: "no URI SAN; two URI SANs; https:// URI; spiffe://td/ns/demo; extra segment; percent-encoding; upper-case trust domain", run: func(t *testing.T, e *badEnv) string {
		noURI := certstest.LeafTemplate(t)
		noURI.DNSNames = []string{"client.demo.svc"}
		return badTLSCases(t, e,
			e.meshLeaf(t, "well-formed (control)", certstest.LeafTemplate(t, clientID.String()), true),
			e.meshLeaf(t, "no URI SAN", noURI, false),
			e.meshLeaf(t, "two URI SANs", certstest.LeafTemplate(t, clientID.String(), "spiffe://cluster.local/ns/demo/sa/other"), false),
			e.meshLeaf(t, "non-SPIFFE URI", certstest.LeafTemplate(t, "https://cluster.local/ns/demo/sa/client"), false),
			e.meshLeaf(t, "no service account", certstest.LeafTemplate(t, "spiffe://cluster.local/ns/demo"), false),
			e.meshLeaf(t, "extra segment", certstest.LeafTemplate(t, clientID.String()+"/extra"), false),
			e.meshLeaf(t, "percent-encoded", certstest.LeafTemplate(t, "spiffe://cluster.local/ns/demo/sa/cli%65nt"), false),
			e.meshLeaf(t, "upper-case trust domain", certstest.LeafTemplate(t, "spiffe://Cluster.local/ns/demo/sa/client"), false),
		)
	}},
	{item: "33", name: "nul in san", sent: "URI SAN spiffe://…/sa/client\\x00x, alone and beside a valid one; otherName SAN with NUL only", run: caseNULSAN},
	{item: "34", name: "outbound wrong identity", sent: "outbound via SOCKS5 to a workload whose 15008 presents another identity (mesh CA, trusted)", run: caseOutboundWrongID},
	{item: "35", name: "broken chains", sent: "leaf without its intermediate; looping intermediates; 50-deep chain; ≈1 MiB chain", run: caseChains},
	// Item 36: gozt is TLS 1.3 only and needs ALPN h2. "Weak ciphers
	// offered" cannot be sent under TLS 1.3 with crypto/tls (a Go client
	// always offers its fixed TLS 1.3 suites), so the TLS 1.2 CBC attempt
	// stands in. A TLS 1.2 hello is refused with an internal_error alert,
	// not protocol_version: certs.ServerConfig's GetConfigForClient refuses
	// a hello without a TLS 1.3 AES-GCM suite before version negotiation.
	{item: "36", name: "protocol", sent: "TLS 1.2 only; TLS 1.2 CBC suite; no ALPN; ALPN http/1.1 only", run: func(t *testing.T, e *badEnv) string {
		tls12 := e.tm.clientTLS(t).Clone()
		tls12.MinVersion, tls12.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
		cbc := tls12.Clone()
		cbc.CipherSuites = []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA}
		noALPN := e.tm.clientTLS(t).Clone()
		noALPN.NextProtos = nil
		h1 := e.tm.clientTLS(t).Clone()
		h1.NextProtos = []string{"http/1.1"}
		return badTLSCases(t, e,
			badTLSTry{"mesh client cert (control)", e.tm.clientTLS(t), true},
			badTLSTry{"TLS 1.2 only", tls12, false},
			badTLSTry{"TLS 1.2 CBC suite", cbc, false},
			badTLSTry{"no ALPN", noALPN, false},
			badTLSTry{"ALPN http/1.1 only", h1, false},
		)
	}},
}

func badNoDial(t *testing.T, s *badSink, before int64) {
	t.Helper()
	if got := s.accepts.Load() - before; got != 0 {
		t.Errorf("backend %s dialed %d times, want 0", s.ln.Addr(), got)
	}
}

// badStatusCases sends a CONNECT to each authority on one connection and wants
// status for each and no dial to s.
func badStatusCases(t *testing.T, e *badEnv, s *badSink, status string, authorities ...string) string {
	t.Helper()
	p := e.peer(t)
	a0 := s.accepts.Load()
	id := uint32(1)
	for _, a := range authorities {
		p.Connect(id, a)
		p.WantStatus(id, status)
		id += 2
	}
	e.followUp(t, p, id)
	badNoDial(t, s, a0)
	return fmt.Sprintf(":status %s for each (%d); no dial; connection serves the next tunnel", status, len(authorities))
}

// badResetCases sends each header list on one connection and wants each
// stream reset with code, no dial, and the connection still serving.
func badResetCases(t *testing.T, e *badEnv, code http2.ErrCode, lists ...[]string) string {
	t.Helper()
	p := e.peer(t)
	a0 := e.target.accepts.Load()
	id := uint32(1)
	for _, fields := range lists {
		p.Headers(id, false, fields...)
		p.WantRST(id, code)
		id += 2
	}
	e.followUp(t, p, id)
	badNoDial(t, e.target, a0)
	return fmt.Sprintf("RST_STREAM %v for each (%d); no dial; connection serves the next tunnel", code, len(lists))
}

func caseNonConnect(t *testing.T, e *badEnv) string {
	p := e.peer(t)
	a0 := e.target.accepts.Load()
	a := e.server(badTargetPort)
	p.Headers(1, true, ":method", "GET", ":scheme", "https", ":path", "/", ":authority", a)
	if f := p.WantStatus(1, "400"); !f.Flags.Has(http2.FlagHeadersEndStream) {
		t.Errorf("400 without END_STREAM")
	}
	p.Headers(3, false, ":method", "POST", ":scheme", "https", ":path", "/", ":authority", a)
	p.Must(p.Framer.WriteData(3, true, []byte("body")))
	p.WantStatus(3, "400")
	e.followUp(t, p, 5)
	badNoDial(t, e.target, a0)
	return "HEADERS :status 400 + END_STREAM for each; no dial; connection serves the next tunnel"
}

func caseLoop(t *testing.T, e *badEnv) string {
	adminPort := e.tm.AdminAddr().(*net.TCPAddr).Port
	lo := e.loopback.ln.Addr().String()
	out := badStatusCases(t, e, e.loopback, "400", lo, fmt.Sprintf("127.0.0.1:%d", adminPort), "[::1]:15000", "169.254.169.254:80")
	s := e.tm.ips.Server
	out2 := badStatusCases(t, e, e.target, "503", s+":15001", s+":15006", s+":15008", s+":15080")
	// gozt refuses other IPs than the one the connection landed on (400, ip
	// mismatch) before any loopback or link-local check, so loopback and
	// metadata addresses are never dialed; the proxy's own ports on the
	// workload IP are refused with 503 (SPEC §1.2).
	return "loopback/admin/link-local: " + out + "; own ports 15001/15006/15008/15080: " + out2
}

func caseHostnames(t *testing.T, e *badEnv) string {
	p := e.peer(t)
	a0 := e.target.accepts.Load()
	p.Connect(1, "nosuch.demo.svc.cluster.local:80")
	p.WantStatus(1, "503")
	// 60 KiB of 63-byte labels: under the 64 KiB header-list cap, over the
	// 253-byte hostname limit.
	label := strings.Repeat("a", 63)
	long := strings.Repeat(label+".", 60<<10/64) + "demo:80"
	p.Connect(3, long)
	p.WantStatus(3, "400")
	// A 65 400-byte :authority and one more field: over the 64 KiB
	// header-list cap, each string under it.
	p.Connect(5, strings.Repeat("a", 65400)+":80", "x-pad", strings.Repeat("p", 1000))
	p.WantStatus(5, "431")
	e.followUp(t, p, 7)
	badNoDial(t, e.target, a0)

	// One string longer than the cap cannot be skipped without decoding
	// it: gozt ends the connection with COMPRESSION_ERROR, as x/net's
	// Framer does (hpack.ErrStringLength at SetMaxStringLength, the
	// header-list cap), rather than answering 431.
	p = e.peer(t)
	p.Connect(1, strings.Repeat("a", 64<<10)+":80")
	p.WantShutdown(http2.ErrCodeCompression)
	badNoDial(t, e.target, a0)
	// Inbound resolves hostnames only against the mesh state, never DNS.
	return "unknown hostname: 503; 60 KiB hostname: 400; 65 400-byte :authority + 1 KiB field: 431; no dial; connection serves the next tunnel; " +
		"a single 64 KiB+3 :authority string: GOAWAY COMPRESSION_ERROR, closed (as x/net)"
}

func caseContinuationFlood(t *testing.T, e *badEnv) string {
	var out []string
	for _, fragSize := range []int{0, 1000} {
		p := e.peer(t)
		p.Must(p.Framer.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: p.Block(":method", "CONNECT")}))
		frag := bytes.Repeat([]byte{0x40}, fragSize)
		wrote := 0
		for wrote < 100000 {
			if p.Framer.WriteContinuation(1, false, frag) != nil {
				break
			}
			wrote++
		}
		p.WantShutdown(http2.ErrCodeEnhanceYourCalm)
		if wrote >= 100000 {
			t.Errorf("fragment %d: server took %d CONTINUATION frames without closing", fragSize, wrote)
		}
		out = append(out, fmt.Sprintf("%d-byte fragments: GOAWAY ENHANCE_YOUR_CALM, closed (client wrote %d frames before the close)", fragSize, wrote))
	}
	return strings.Join(out, "; ")
}

func caseHPACKBomb(t *testing.T, e *badEnv) string {
	p := e.peer(t)
	a0 := e.target.accepts.Load()
	fields := []string{":method", "CONNECT", ":authority", e.server(badTargetPort)}
	big := strings.Repeat("a", 4000)
	for range 100 {
		fields = append(fields, "x-bomb", big)
	}
	block := p.Block(fields...)
	p.WriteBlock(1, false, block)
	p.WantStatus(1, "431")
	crumbs := []string{":method", "CONNECT", ":authority", e.server(badTargetPort)}
	for range 10000 {
		crumbs = append(crumbs, "cookie", "a=b")
	}
	block2 := p.Block(crumbs...)
	p.WriteBlock(3, false, block2)
	p.WantStatus(3, "431")
	// The server decoded both blocks to the end: the HPACK state is in
	// step, so the next request (encoded against it) works.
	e.followUp(t, p, 5)
	badNoDial(t, e.target, a0)
	return fmt.Sprintf("%d-byte block → 431; %d-byte cookie block → 431; no dial; HPACK state intact (next tunnel works)", len(block), len(block2))
}

func caseBadHPACK(t *testing.T, e *badEnv) string {
	var out []string
	for _, tc := range []struct {
		name  string
		block []byte
	}{
		// Literal without indexing, new name: a Huffman name of one byte
		// 0x00 ('0' and three zero bits of padding, which must be ones).
		{"bad Huffman", []byte{0x00, 0x81, 0x00, 0x01, 'x'}},
		// Dynamic table size update (001xxxxx) to 8192: 31 + 8161.
		{"table size update 8192", []byte{0x3f, 0xe1, 0x3f, 0x82}},
	} {
		p := e.peer(t)
		p.WriteBlock(1, false, tc.block)
		p.WantShutdown(http2.ErrCodeCompression)
		out = append(out, tc.name+": GOAWAY COMPRESSION_ERROR, closed")
	}
	return strings.Join(out, "; ")
}

// badFlood writes frames with send from its own goroutine until n are written
// or a write fails; wait waits for it.
func badFlood(p *hbonetest.Peer, n int, send func(p *hbonetest.Peer) error) (wait func() int) {
	done := make(chan int, 1)
	go func() {
		i := 0
		for ; i < n; i++ {
			if send(p) != nil {
				break
			}
		}
		done <- i
	}()
	return func() int { return <-done }
}

func caseRapidReset(t *testing.T, e *badEnv) string {
	p := e.peer(t)
	a0 := e.target.accepts.Load()
	id := uint32(1)
	wait := badFlood(p, 3000, func(p *hbonetest.Peer) error {
		err := p.Framer.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.Block(":method", "CONNECT", ":authority", e.server(badTargetPort)), EndHeaders: true})
		if err == nil {
			err = p.Framer.WriteRSTStream(id, http2.ErrCodeCancel)
		}
		id += 2
		return err
	})
	p.WantShutdown(http2.ErrCodeEnhanceYourCalm)
	sent := wait()
	dials := e.target.accepts.Load() - a0
	// The server counts 1000 peer resets per 10 s and serves at most 200
	// streams at once: whatever raced to a dial is bounded by both.
	if dials > 1200 {
		t.Errorf("%d upstream dials for %d reset streams, want at most 1200", dials, sent)
	}
	badWaitFor(t, 15*time.Second, "upstream legs of reset streams closed", func() bool { return e.target.open.Load() == 0 })
	return fmt.Sprintf("GOAWAY ENHANCE_YOUR_CALM, closed after %d streams; %d upstream dials, all closed after", sent, dials)
}

func caseMadeYouReset(t *testing.T, e *badEnv) string {
	p := e.peer(t)
	id := uint32(1)
	wait := badFlood(p, 2000, func(p *hbonetest.Peer) error {
		err := p.Framer.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.Block(":method", "CONNECT", ":authority", e.server(badTargetPort)), EndHeaders: true})
		if err == nil {
			err = p.Framer.WriteWindowUpdate(id, 0)
		}
		id += 2
		return err
	})
	p.WantRST(1, http2.ErrCodeProtocol)
	p.WantShutdown(http2.ErrCodeEnhanceYourCalm)
	n1 := wait()

	// DATA on streams the client reset: each asks for a STREAM_CLOSED.
	p = e.peer(t)
	var ids []uint32
	for id := uint32(1); id < 9; id += 2 {
		p.Connect(id, e.server(badTargetPort))
		p.WantStatus(id, "200")
		p.Must(p.Framer.WriteRSTStream(id, http2.ErrCodeCancel))
		ids = append(ids, id)
	}
	i := 0
	wait = badFlood(p, 2000, func(p *hbonetest.Peer) error {
		i++
		return p.Framer.WriteData(ids[i%len(ids)], false, []byte{0})
	})
	p.WantShutdown(http2.ErrCodeEnhanceYourCalm)
	n2 := wait()
	badWaitFor(t, 15*time.Second, "upstream legs closed", func() bool { return e.target.open.Load() == 0 })
	return fmt.Sprintf("WINDOW_UPDATE 0: RST_STREAM PROTOCOL_ERROR, then GOAWAY ENHANCE_YOUR_CALM after %d streams; DATA on reset streams: GOAWAY ENHANCE_YOUR_CALM after %d frames", n1, n2)
}

func caseMaxStreams(t *testing.T, e *badEnv) string {
	const n, limit = 210, 200
	p := e.peer(t)
	for i := range n {
		p.Connect(uint32(2*i+1), e.server(badEchoPort))
	}
	ok, refused := 0, 0
	for ok+refused < n {
		f := p.Want(func(f hbonetest.Frame) bool {
			return f.Type == http2.FrameGoAway || f.Type == http2.FrameHeaders || f.Type == http2.FrameRSTStream
		})
		switch {
		case f.Type == http2.FrameHeaders && f.Header(":status") == "200" && f.Stream <= 2*limit:
			ok++
		case f.Type == http2.FrameRSTStream && f.Code == http2.ErrCodeRefusedStream && f.Stream > 2*limit:
			refused++
		default:
			t.Fatalf("got %v (code %v, status %q) on stream %d", f.Type, f.Code, f.Header(":status"), f.Stream)
		}
	}
	// The first streams are unaffected: the first and the last still echo.
	p.Echo(1, []byte("first"))
	p.Echo(2*limit-1, []byte("last"))
	return fmt.Sprintf("%d × 200, %d × RST_STREAM REFUSED_STREAM (streams above the limit); first and 200th tunnels still echo", ok, refused)
}

func badFloodCase(send func(p *hbonetest.Peer) error) func(t *testing.T, e *badEnv) string {
	return func(t *testing.T, e *badEnv) string {
		p := e.peer(t)
		wait := badFlood(p, 1000, send)
		p.WantShutdown(http2.ErrCodeEnhanceYourCalm)
		return fmt.Sprintf("GOAWAY ENHANCE_YOUR_CALM, closed (client wrote %d frames)", wait())
	}
}

func caseEmptyFrames(t *testing.T, e *badEnv) string {
	p := e.peer(t)
	p.Connect(1, e.server(badEchoPort))
	p.WantStatus(1, "200")
	wait := badFlood(p, 1000, func(p *hbonetest.Peer) error { return p.Framer.WriteData(1, false, nil) })
	p.WantShutdown(http2.ErrCodeEnhanceYourCalm)
	n1 := wait()

	p = e.peer(t)
	id := uint32(1)
	wait = badFlood(p, 1000, func(p *hbonetest.Peer) error {
		err := p.Framer.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true})
		id += 2
		return err
	})
	p.WantRST(1, http2.ErrCodeProtocol)
	p.WantShutdown(http2.ErrCodeEnhanceYourCalm)
	n2 := wait()
	return fmt.Sprintf("empty DATA: GOAWAY ENHANCE_YOUR_CALM after %d frames; empty HEADERS: RST_STREAM PROTOCOL_ERROR each, GOAWAY ENHANCE_YOUR_CALM after %d", n1, n2)
}

func caseWindowOverflow(t *testing.T, e *badEnv) string {
	p := e.peer(t)
	p.Connect(1, e.server(badEchoPort))
	p.WantStatus(1, "200")
	p.Must(p.Framer.WriteWindowUpdate(1, 1<<31-1))
	p.WantRST(1, http2.ErrCodeFlowControl)
	e.followUp(t, p, 3)
	p = e.peer(t)
	p.Must(p.Framer.WriteWindowUpdate(0, 1<<31-1))
	p.WantShutdown(http2.ErrCodeFlowControl)
	return "stream: RST_STREAM FLOW_CONTROL_ERROR, connection serves the next tunnel; connection: GOAWAY FLOW_CONTROL_ERROR, closed"
}

func caseNeverReads(t *testing.T, e *badEnv) string {
	p := e.peer(t)
	p.Must(p.Framer.WriteWindowUpdate(0, 1<<30)) // only the stream window binds
	f0 := e.fire.bytes.Load()
	p.Connect(1, e.server(badFirePort))
	p.WantStatus(1, "200")
	// The firehose writes until gozt stops reading from it: wait until its
	// count stops moving, sampled 200 ms apart.
	var last int64 = -1
	stable := 0
	badWaitFor(t, 30*time.Second, "firehose blocked", func() bool {
		time.Sleep(200 * time.Millisecond)
		n := e.fire.bytes.Load()
		if n == last && n > f0 {
			stable++
		} else {
			stable = 0
		}
		last = n
		return stable >= 3
	})
	// Meanwhile another tunnel on the same connection flows.
	p.Connect(3, e.server(badEchoPort))
	p.WantStatus(3, "200")
	msg := make([]byte, 16<<10)
	for range 64 {
		rand.Read(msg)
		p.Echo(3, msg)
	}
	// Stream 1 got no more than its 65 535-byte window.
	got := p.Received(1)
	if got == 0 || got > 65535 {
		t.Errorf("stream 1 received %d bytes with a 65535-byte window, want 1..65535", got)
	}
	written := e.fire.bytes.Load() - f0
	// What the firehose wrote sits in the kernel (its 64 KiB send buffer,
	// gozt's receive buffer, which autotuning grows only while gozt reads)
	// and gozt's bounded stream buffer; a relay that kept reading toward a
	// stream without window would not block here.
	if written > 4<<20 {
		t.Errorf("backend wrote %d bytes toward a stream that never reads; want it blocked below 4 MiB", written)
	}
	return fmt.Sprintf("stream 1 received %d B (window 65535); the backend blocked after writing %d KiB; 1 MiB echoed on stream 3 meanwhile", got, written>>10)
}

func caseSlowloris(t *testing.T, e *badEnv) string {
	const silent, trickle = 50, 50
	type result struct {
		closedBy string
		after    time.Duration
	}
	results := make(chan result, silent+trickle)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range silent + trickle {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(e.tm.ips.Client)}}
		c, err := d.Dial("tcp", e.server("15008"))
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		stop := make(chan struct{})
		if i >= silent {
			wg.Add(1)
			go func() { // a ClientHello record header, then one byte a second
				defer wg.Done()
				if _, err := c.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00}); err != nil {
					return
				}
				tick := time.NewTicker(time.Second)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						if _, err := c.Write([]byte{0x01}); err != nil {
							return
						}
					}
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(stop)
			c.SetReadDeadline(time.Now().Add(60 * time.Second))
			_, err := io.Copy(io.Discard, c)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				results <- result{"nobody (still open at 60 s)", time.Since(start)}
				return
			}
			results <- result{"server", time.Since(start)}
		}()
	}
	// A legitimate client is served while the 100 hang.
	e.followUp(t, e.peer(t), 1)
	legit := time.Since(start)
	wg.Wait()
	close(results)
	var latest time.Duration
	for r := range results {
		if r.closedBy != "server" {
			t.Errorf("slow connection closed by %s", r.closedBy)
		}
		latest = max(latest, r.after)
	}
	return fmt.Sprintf("legit client tunnelled at %v; all %d slow connections closed by the server (last at %v; handshake deadline 10 s)", legit.Round(time.Millisecond), silent+trickle, latest.Round(time.Second))
}

// badCollectUntilClosed reads frames until the server closes the connection
// and names the frame types seen.
func badCollectUntilClosed(t *testing.T, p *hbonetest.Peer) string {
	t.Helper()
	var seen []string
	timeout := time.After(60 * time.Second)
	for {
		select {
		case f, ok := <-p.Frames():
			if !ok {
				return strings.Join(seen, ", ")
			}
			s := f.Type.String()
			if f.Type == http2.FrameGoAway {
				s += " " + f.Code.String()
			}
			if len(seen) == 0 || seen[len(seen)-1] != s {
				seen = append(seen, s)
			}
		case <-timeout:
			t.Fatalf("connection still open after 60 s; frames seen: %v", seen)
		}
	}
}

func caseEarlyData(t *testing.T, e *badEnv) string {
	p := e.peer(t)
	a0, b0 := e.denied.accepts.Load(), e.denied.bytes.Load()
	p.Connect(1, e.server(badDeniedPort))
	p.Must(p.Framer.WriteData(1, false, []byte("GET /admin HTTP/1.1\r\nHost: x\r\n\r\n")))
	p.WantStatus(1, "401")
	e.followUp(t, p, 3)
	if a, b := e.denied.accepts.Load()-a0, e.denied.bytes.Load()-b0; a != 0 || b != 0 {
		t.Errorf("denied destination saw %d connections and %d bytes, want 0 and 0", a, b)
	}
	return "HEADERS :status 401; denied destination: 0 accepts, 0 bytes; connection serves the next tunnel"
}

func caseClientGoAway(t *testing.T, e *badEnv) string {
	p := e.peer(t)
	p.Connect(1, e.server(badEchoPort))
	p.WantStatus(1, "200")
	p.Echo(1, []byte("before goaway"))
	p.Must(p.Framer.WriteGoAway(0, http2.ErrCodeNo, nil))
	p.Echo(1, []byte("after goaway"))
	p.Must(p.Framer.WriteData(1, true, nil))
	f := p.Want(func(f hbonetest.Frame) bool {
		return f.Type == http2.FrameGoAway || f.Stream == 1 && (f.Type == http2.FrameRSTStream || f.Flags.Has(http2.FlagDataEndStream))
	})
	if f.Type != http2.FrameData && f.Type != http2.FrameHeaders {
		t.Fatalf("got %v (code %v) on stream %d, want the tunnel ended with END_STREAM", f.Type, f.Code, f.Stream)
	}
	return "in-flight tunnel kept echoing after the client's GOAWAY and ended cleanly with END_STREAM both ways"
}

// addWorkload inserts an HBONE workload with service account sa at ip;
// gozt serves no listener for it (it was not there at start), so a test
// may play its destination.
func (e *badEnv) addWorkload(t *testing.T, name, ip string) identity.Identity {
	t.Helper()
	var err error
	e.tm.Store().Update(func(b *state.Batch) {
		err = b.InsertWorkload(&state.Workload{
			UID: "Kubernetes//Pod/demo/" + name, Name: name, Namespace: "demo", ServiceAccount: name,
			Addresses: []netip.Addr{netip.MustParseAddr(ip)}, Protocol: state.TunnelHBONE, CanonicalName: name,
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: name}
}

func badSOCKSDial(e *badEnv, target string) (net.Conn, error) {
	d, err := xproxy.SOCKS5("tcp", net.JoinHostPort(e.tm.ips.Client, "15080"), nil, xproxy.Direct)
	if err != nil {
		return nil, err
	}
	return d.Dial("tcp", target)
}

func badHBONEEcho(s *hbone.ServerStream) {
	if s.Respond(200, nil) != nil {
		return
	}
	io.Copy(s, s)
	s.CloseWrite()
	s.Close()
}

func caseDestGoAway(t *testing.T, e *badEnv) string {
	id := e.addWorkload(t, "ext", e.ext)
	cert, err := e.tm.CA().Issue(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	srvA := &hbone.Server{Handler: badHBONEEcho}
	srvB := &hbone.Server{Handler: badHBONEEcho}
	fd := listenBadFakeDest(t, net.JoinHostPort(e.ext, "15008"), cert, func(n int64, c net.Conn) {
		srv := srvB
		if n == 1 {
			srv = srvA
		}
		srv.ServeConn(context.Background(), c)
	})
	t.Cleanup(func() { srvA.Close(); srvB.Close() })
	target := net.JoinHostPort(e.ext, "8080")
	c1, err := badSOCKSDial(e, target)
	if err != nil {
		t.Fatalf("first connection: %v", err)
	}
	defer c1.Close()
	roundTrip(t, c1)
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		shut <- srvA.Shutdown(ctx)
	}()
	// Wait until srvA refuses new connections: its GOAWAY is on its way.
	badWaitFor(t, 5*time.Second, "destination draining", func() bool {
		a, b := net.Pipe()
		b.Close()
		return errors.Is(srvA.ServeConn(context.Background(), a), hbone.ErrServerClosed)
	})
	roundTrip(t, c1) // the in-flight tunnel still works
	c2, err := badSOCKSDial(e, target)
	if err != nil {
		t.Fatalf("connection after GOAWAY: %v", err)
	}
	roundTrip(t, c2)
	c2.Close()
	c1.(*net.TCPConn).CloseWrite()
	if rest, err := io.ReadAll(c1); err != nil || len(rest) != 0 {
		t.Errorf("first tunnel after half-close: %q, %v; want clean EOF", rest, err)
	}
	c1.Close()
	if err := <-shut; err != nil {
		t.Errorf("destination Shutdown = %v; the in-flight tunnel did not complete", err)
	}
	if n := fd.handshakes.Load(); n != 2 {
		t.Errorf("destination saw %d HBONE connections, want 2 (a new one after GOAWAY)", n)
	}
	return fmt.Sprintf("in-flight tunnel completed (echo, clean EOF, drain returned); next connection went over a new HBONE connection (%d TLS connections in all)", fd.handshakes.Load())
}

func caseOutboundWrongID(t *testing.T, e *badEnv) string {
	e.addWorkload(t, "victim", e.victim)
	impostor := identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "impostor"}
	cert, err := e.tm.CA().Issue(context.Background(), impostor)
	if err != nil {
		t.Fatal(err)
	}
	var got sync.Map
	fd := listenBadFakeDest(t, net.JoinHostPort(e.victim, "15008"), cert, func(n int64, c net.Conn) {
		b, _ := io.ReadAll(io.LimitReader(c, 1<<20))
		got.Store(n, len(b))
	})
	c, err := badSOCKSDial(e, net.JoinHostPort(e.victim, "8080"))
	seen := ""
	if err != nil {
		seen = "SOCKS5 dial failed: " + errClass(err)
	} else {
		c.SetDeadline(time.Now().Add(15 * time.Second))
		c.Write([]byte("secret"))
		n, rerr := io.ReadFull(c, make([]byte, 1))
		c.Close()
		if n != 0 || rerr == nil {
			t.Fatalf("client read %d bytes through a destination with the wrong identity", n)
		}
		if !errors.Is(rerr, syscall.ECONNRESET) {
			// A clean EOF would read like an empty answer.
			t.Errorf("client connection ended with %v, want a reset", rerr)
		}
		seen = "SOCKS5 accepted, then the client connection ended: " + errClass(rerr)
	}
	if fd.accepts.Load() == 0 {
		t.Fatalf("gozt never connected to the destination (the case tested nothing)")
	}
	badWaitFor(t, 15*time.Second, "destination handshakes ended", func() bool {
		return fd.handshakes.Load()+fd.hsErrs.Load() == fd.accepts.Load()
	})
	if n := fd.handshakes.Load(); n != 0 {
		t.Errorf("destination completed %d TLS handshakes with gozt, want 0", n)
	}
	return fmt.Sprintf("%s; destination: %d TCP connects, %d completed handshakes, %d failed, 0 bytes of HTTP/2", seen, fd.accepts.Load(), fd.handshakes.Load(), fd.hsErrs.Load())
}

// errClass names err without its addresses.
func errClass(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset (RST)"
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "EOF"
	}
	return err.Error()
}

func caseNotTLS(t *testing.T, e *badEnv) string {
	junk := make([]byte, 1024)
	r := mrand.New(mrand.NewPCG(25, 25))
	for i := range junk {
		junk[i] = byte(r.Uint32())
	}
	junk[0] = 0x47 // not a TLS record type
	var out []string
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"HTTP/1.1", []byte("GET / HTTP/1.1\r\nHost: " + e.server(badTargetPort) + "\r\n\r\n")},
		{"h2c prior knowledge", []byte(badPreface + "\x00\x00\x00\x04\x00\x00\x00\x00\x00")},
		{"random bytes", junk},
	} {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(e.tm.ips.Client)}}
		c, err := d.Dial("tcp", e.server("15008"))
		if err != nil {
			t.Fatal(err)
		}
		c.Write(tc.data)
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := io.ReadAll(c)
		c.Close()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("%s: connection still open after 30 s", tc.name)
		}
		if bytes.Contains(resp, []byte("HTTP/")) || len(resp) > 7 {
			t.Errorf("%s: server answered %q, want at most a TLS alert", tc.name, resp)
		}
		what := "closed, nothing sent"
		if len(resp) > 0 {
			what = fmt.Sprintf("closed after %d bytes (TLS alert record 0x%02x)", len(resp), resp[0])
		}
		out = append(out, tc.name+": "+what)
	}
	return strings.Join(out, "; ")
}

func caseHostileHeaders(t *testing.T, e *badEnv) string {
	p := e.peer(t)
	a0 := e.target.accepts.Load()
	p.Connect(1, e.server(badTargetPort),
		"forwarded", "for=1.2.3.4;proto=https, for=\"[2001:db8::1]:80\"",
		"x-forwarded-for", "5.6.7.8",
		"baggage", "k8s.namespace.name=evil,,,;;==,k8s.pod.name="+strings.Repeat("x", 4000),
		"traceparent", "00-zzzz-not-hex-01",
		"x-forwarded-network", "evil-network",
	)
	p.WantStatus(1, "200")
	p.Must(p.Framer.WriteData(1, true, []byte("hello")))
	badWaitFor(t, 5*time.Second, "backend dialed", func() bool { return e.target.accepts.Load() > a0 })
	src := e.target.lastSource()
	if host, _, _ := net.SplitHostPort(src); host != e.tm.ips.Client {
		t.Errorf("backend saw source %s, want the HBONE peer %s", src, e.tm.ips.Client)
	}
	// Authorization sees the peer, not the headers: still denied.
	p.Connect(3, e.server(badDeniedPort), "forwarded", "for=1.2.3.4", "x-forwarded-for", "1.2.3.4")
	p.WantStatus(3, "401")
	e.followUp(t, p, 5)
	host, _, _ := net.SplitHostPort(src)
	return fmt.Sprintf("200; backend saw source %s, the HBONE peer (not Forwarded/X-Forwarded-For); same headers to the denied port: 401", host)
}

func caseRandomFrames(t *testing.T, e *badEnv) string {
	const conns, perConn = 20, 100
	outcomes := map[string]int{}
	wrote := 0
	for i := range conns {
		p := e.peer(t)
		r := mrand.New(mrand.NewPCG(27, uint64(i)))
		for range perConn {
			payload := make([]byte, r.IntN(64))
			for j := range payload {
				payload[j] = byte(r.Uint32())
			}
			if p.Framer.WriteRawFrame(http2.FrameType(r.IntN(16)), http2.Flags(r.Uint32()), r.Uint32N(8), payload) != nil {
				break
			}
			wrote++
		}
		outcomes[randomOutcome(t, p)]++
		p.Close()
	}
	// The process lives on: a new connection is served.
	e.followUp(t, e.peer(t), 1)
	return fmt.Sprintf("%d connections, %d frames written; outcomes %v; a new connection is served", conns, wrote, outcomes)
}

// randomOutcome pings and reads until the PING is acknowledged ("open") or
// the server closes the connection ("GOAWAY <code>" or "closed").
func randomOutcome(t *testing.T, p *hbonetest.Peer) string {
	t.Helper()
	p.Framer.WritePing(false, [8]byte{7}) // fails if the server already closed
	outcome := "closed"
	timeout := time.After(15 * time.Second)
	for {
		select {
		case f, ok := <-p.Frames():
			switch {
			case !ok:
				return outcome
			case f.Type == http2.FrameGoAway:
				outcome = "GOAWAY " + f.Code.String()
			case f.Type == http2.FramePing && f.Flags.Has(http2.FlagPingAck) && f.Data[0] == 7 && outcome == "closed":
				return "open"
			}
		case <-timeout:
			t.Fatalf("neither PING ack nor close within 15 s")
		}
	}
}

// badTLSTry is one TLS attempt and whether the server must accept it.
type badTLSTry struct {
	name   string
	cfg    *tls.Config
	accept bool
}

func badTLSCases(t *testing.T, e *badEnv, tries ...badTLSTry) string {
	t.Helper()
	var out []string
	for _, tr := range tries {
		err := e.tlsAttempt(t, tr.cfg)
		switch {
		case tr.accept && err != nil:
			t.Errorf("%s: refused (%v), want accepted", tr.name, err)
		case !tr.accept && err == nil:
			t.Errorf("%s: accepted, want the handshake refused", tr.name)
		}
		if err == nil {
			out = append(out, tr.name+": accepted")
		} else {
			out = append(out, tr.name+": refused ("+badShortErr(err)+")")
		}
	}
	return strings.Join(out, "; ")
}

func badShortErr(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, "tls: "); i >= 0 {
		s = s[i:]
	}
	return s
}

// meshLeaf mints tmpl with the mesh's own CA key, so that only what tmpl
// gets wrong can fail.
func (e *badEnv) meshLeaf(t *testing.T, name string, tmpl *x509.Certificate, accept bool) badTLSTry {
	t.Helper()
	der, key := badMint(t, tmpl, e.caCert, e.caKey)
	return badTLSTry{name, badClientTLS([][]byte{der}, key), accept}
}

var badOIDSAN = asn1.ObjectIdentifier{2, 5, 29, 17}

// badSANExtension encodes GeneralNames by hand, so that it can hold bytes
// crypto/x509 would refuse to encode.
func badSANExtension(t *testing.T, names ...asn1.RawValue) pkix.Extension {
	t.Helper()
	var body []byte
	for _, n := range names {
		b, err := asn1.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		body = append(body, b...)
	}
	v, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSequence, IsCompound: true, Bytes: body})
	if err != nil {
		t.Fatal(err)
	}
	return pkix.Extension{Id: badOIDSAN, Value: v}
}

func caseNULSAN(t *testing.T, e *badEnv) string {
	nul := clientID.String() + "\x00x"
	uri := func(s string) asn1.RawValue {
		return asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 6, Bytes: []byte(s)}
	}
	other := func(s string) asn1.RawValue {
		oid, _ := asn1.Marshal(asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 37476, 9000, 64, 1})
		str, _ := asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagUTF8String, Bytes: []byte(s)})
		val, _ := asn1.Marshal(asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: str})
		return asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: append(oid, val...)}
	}
	with := func(names ...asn1.RawValue) *x509.Certificate {
		tmpl := certstest.LeafTemplate(t)
		tmpl.ExtraExtensions = []pkix.Extension{badSANExtension(t, names...)}
		return tmpl
	}
	return badTLSCases(t, e,
		e.meshLeaf(t, "hand-encoded valid URI SAN (control)", with(uri(clientID.String())), true),
		e.meshLeaf(t, "URI SAN with NUL", with(uri(nul)), false),
		e.meshLeaf(t, "otherName SAN with NUL only", with(other(nul)), false),
		e.meshLeaf(t, "URI SAN with NUL beside a valid one", with(uri(clientID.String()), uri(nul)), false),
	)
}

func caseChains(t *testing.T, e *badEnv) string {
	// An intermediate under the mesh root, and a leaf under it.
	interDER, interKey := badMint(t, badCATemplate("mesh intermediate"), e.caCert, e.caKey)
	inter := badParseCert(t, interDER)
	leaf, leafKey := badMint(t, certstest.LeafTemplate(t, clientID.String()), inter, interKey)

	// Two intermediates that sign each other, and a leaf under one.
	keyA, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	keyB, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tA, tB := badCATemplate("loop A"), badCATemplate("loop B")
	tA.SerialNumber, tB.SerialNumber = badBigInt(1), badBigInt(2)
	tA.NotBefore, tA.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	tB.NotBefore, tB.NotAfter = tA.NotBefore, tA.NotAfter
	aDER, err := x509.CreateCertificate(rand.Reader, tA, tB, keyA.Public(), keyB)
	if err != nil {
		t.Fatal(err)
	}
	bDER, err := x509.CreateCertificate(rand.Reader, tB, tA, keyB.Public(), keyA)
	if err != nil {
		t.Fatal(err)
	}
	loopLeaf, loopKey := badMint(t, certstest.LeafTemplate(t, clientID.String()), badParseCert(t, aDER), keyA)

	// 50 intermediates deep.
	parent, parentKey := e.caCert, e.caKey
	var deep [][]byte
	for i := range 50 {
		der, k := badMint(t, badCATemplate(fmt.Sprintf("deep %d", i)), parent, parentKey)
		deep = append([][]byte{der}, deep...)
		parent, parentKey = badParseCert(t, der), k
	}
	deepLeaf, deepKey := badMint(t, certstest.LeafTemplate(t, clientID.String()), parent, parentKey)

	// About 1 MiB: the good chain and 35 padded certificates.
	huge := [][]byte{leaf, interDER}
	for i := range 35 {
		tmpl := badCATemplate(fmt.Sprintf("padding %d", i))
		tmpl.ExtraExtensions = []pkix.Extension{{Id: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 99999, 1}, Value: bytes.Repeat([]byte{0x5a}, 30<<10)}}
		der, _ := badMint(t, tmpl, nil, nil)
		huge = append(huge, der)
	}
	return badTLSCases(t, e,
		badTLSTry{"leaf + intermediate (control)", badClientTLS([][]byte{leaf, interDER}, leafKey), true},
		badTLSTry{"leaf without its intermediate", badClientTLS([][]byte{leaf}, leafKey), false},
		badTLSTry{"looping intermediates", badClientTLS([][]byte{loopLeaf, aDER, bDER}, loopKey), false},
		badTLSTry{"50-deep chain", badClientTLS(append([][]byte{deepLeaf}, deep...), deepKey), false},
		badTLSTry{fmt.Sprintf("%d KiB chain", badChainSize(huge)>>10), badClientTLS(huge, leafKey), false},
	)
}

func badBigInt(n int64) *big.Int { return new(big.Int).SetInt64(n) }

func badChainSize(chain [][]byte) int {
	n := 0
	for _, c := range chain {
		n += len(c)
	}
	return n
}
