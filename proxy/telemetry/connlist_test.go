package telemetry

import (
	"log/slog"
	"net"
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestLiveConnsLegs: a listed connection's downstream leg is held only
// until the hand-off takes its counters, or until it closes; spliced TCP
// pairs get no counters; an unlisted record binds nothing.
func TestLiveConnsLegs(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	log := slog.New(slog.DiscardHandler)
	var l ConnList
	legs := func() int {
		n := 0
		l.legs.Range(func(_, _ any) bool { n++; return true })
		return n
	}
	down, up := net.Pipe()
	defer down.Close()
	defer up.Close()

	rec := m.open(log, Labels{Reporter: "source", SrcWorkload: "client", SrcNamespace: "demo"}, false)
	l.Add(rec, ConnAddrs{Src: netip.MustParseAddrPort("192.0.2.1:1000"), Authority: "svc.demo:80",
		ActualDst: netip.MustParseAddrPort("192.0.2.2:15008"), Protocol: "HBONE"})
	l.Bind(rec, down)
	if n := legs(); n != 1 {
		t.Fatalf("after bind %d legs held, want 1", n)
	}
	req, resp := l.Counters(down, up)
	if req == nil || resp == nil {
		t.Fatal("counters of a listed, non-spliced connection are nil")
	}
	req.Add(5)
	if n := legs(); n != 0 {
		t.Errorf("after hand-off %d legs held, want 0", n)
	}
	got, total := l.Live(nil, 10)
	if total != 1 || len(got) != 1 || got[0].RequestBytes != 5 || !got[0].BytesLive || got[0].SrcWorkload != "demo/client" {
		t.Errorf("Live = %+v, %d; want one with 5 request bytes, live, from demo/client", got, total)
	}
	// The addresses, kept as values, are formatted when the view is read.
	want := ConnJSON{Src: "192.0.2.1:1000", OriginalDst: "svc.demo:80", ActualDst: "192.0.2.2:15008", Protocol: "HBONE"}
	if len(got) == 1 && (got[0].ConnJSON != want || got[0].Direction != "outbound") {
		t.Errorf("Live[0] = %+v, %s; want %+v, outbound", got[0].ConnJSON, got[0].Direction, want)
	}
	if _, out := l.Conns(); len(out) != 1 || out[0] != want {
		t.Errorf("Conns outbound = %+v, want [%+v]", out, want)
	}
	if _, total := l.Live(nil, 0); total != 1 {
		t.Errorf("Live(max 0) total = %d, want 1", total)
	}

	rec2 := m.open(log, Labels{Reporter: "source"}, false)
	l.Add(rec2, ConnAddrs{})
	l.Bind(rec2, up)
	l.remove(rec2) // closed before the hand-off
	if n := legs(); n != 0 {
		t.Errorf("after close %d legs held, want 0", n)
	}

	unlisted := m.open(log, Labels{Reporter: "source"}, false)
	l.Bind(unlisted, down)
	if n := legs(); n != 0 {
		t.Errorf("an unlisted record bound %d legs", n)
	}

	a, b := tcpPair(t)
	rec3 := m.open(log, Labels{Reporter: "source"}, false)
	l.Add(rec3, ConnAddrs{Protocol: "TCP"})
	l.Bind(rec3, a)
	if req, resp := l.Counters(a, b); req != nil || resp != nil {
		t.Error("a spliced TCP pair got live counters")
	}
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.82.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a.(*net.TCPConn), b.(*net.TCPConn)
}
