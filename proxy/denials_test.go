package proxy

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

// TestDenialsRingBound: the ring keeps only its last n denials, newest
// first, however many are recorded, and counts them all.
func TestDenialsRingBound(t *testing.T) {
	for _, tc := range []struct {
		name      string
		size, add int
	}{
		{"empty", 4, 0},
		{"partial", 4, 3},
		{"full", 4, 4},
		{"wrapped", 4, 11},
		{"default size", 0, 3 * DefaultDenials},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds := NewDenials(tc.size)
			for i := range tc.add {
				ds.Record(Denial{Reason: fmt.Sprint(i)})
			}
			size := tc.size
			if size <= 0 {
				size = DefaultDenials
			}
			var want []string
			for i := tc.add - 1; i >= 0 && len(want) < size; i-- {
				want = append(want, fmt.Sprint(i))
			}
			recent, total := ds.Recent()
			got := []string{}
			for _, d := range recent {
				got = append(got, d.Reason)
			}
			if want == nil {
				want = []string{}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Recent() after %d records in a ring of %d (-want +got):\n%s", tc.add, tc.size, diff)
			}
			if total != uint64(tc.add) {
				t.Errorf("Recent() total = %d, want %d", total, tc.add)
			}
			if len(ds.ring) != size {
				t.Errorf("ring grew to %d slots, want %d", len(ds.ring), size)
			}
		})
	}
}

// TestDenialsNil: a nil *Denials records nothing and lists nothing.
func TestDenialsNil(t *testing.T) {
	var ds *Denials
	ds.Record(Denial{Reason: "x"})
	if recent, total := ds.Recent(); len(recent) != 0 || total != 0 {
		t.Errorf("nil Denials Recent() = %v, %d; want none", recent, total)
	}
}

// TestNoteDenialNamesPolicyAndRule: a refusal by authorize is recorded with
// the deciding policy and rule; any other error is not a denial.
func TestNoteDenialNamesPolicyAndRule(t *testing.T) {
	client := identity.Identity{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "client"}
	pol := &rbac.Policy{Name: "deny-8080", Namespace: "demo", Scope: rbac.Namespace, Action: rbac.Deny,
		Rules: []rbac.Rule{
			{Clauses: []rbac.Clause{{Matches: []rbac.Match{{DestinationPorts: []uint16{9999}}}}}},
			{Clauses: []rbac.Clause{{Matches: []rbac.Match{{DestinationPorts: []uint16{8080}}}}}},
		}}
	st := state.NewStore(state.Config{})
	var err error
	st.Update(func(b *state.Batch) {
		if err = b.InsertPolicy(pol); err != nil {
			return
		}
		err = b.InsertWorkload(&state.Workload{UID: "uid-server", Name: "server", Namespace: "demo",
			Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.3")}})
	})
	if err != nil {
		t.Fatal(err)
	}
	snap := st.Snapshot()
	local := snap.WorkloadByUID("uid-server")
	ds := NewDenials(4)
	p := &Proxy{cfg: Config{Denials: ds}}
	c := rbac.Conn{Src: netip.MustParseAddrPort("10.0.0.2:4000"), Dst: netip.MustParseAddrPort("10.0.0.3:8080"), Identity: client}

	p.noteDenial(snap, local, ViaTCP, c, errNoLocalWorkload) // not authorization's
	authzErr := authorize(snap, local, c)
	if authzErr == nil {
		t.Fatal("authorize allowed a connection the DENY policy matches")
	}
	p.noteDenial(snap, local, ViaTCP, c, authzErr)

	recent, _ := ds.Recent()
	if len(recent) != 1 {
		t.Fatalf("recorded %d denials, want 1: %+v", len(recent), recent)
	}
	d := recent[0]
	if d.Time.IsZero() {
		t.Error("denial has no time")
	}
	want := Denial{Time: d.Time, Workload: "demo/server", WorkloadUID: "uid-server", Via: ViaTCP,
		Src: c.Src, SrcIdentity: client.String(), Dst: c.Dst, Policy: "demo/deny-8080", Rule: 1,
		Reason: "denied by policy demo/deny-8080 rule 1 (destination_ports)"}
	if diff := cmp.Diff(want, d, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
		t.Errorf("denial (-want +got):\n%s", diff)
	}
}

// TestLiveConnsLegs: a listed connection's downstream leg is held only
// until the hand-off takes its counters, or until it closes; spliced TCP
// pairs get no counters; an unlisted record binds nothing.
func TestLiveConnsLegs(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	log := slog.New(slog.DiscardHandler)
	var l liveConns
	legs := func() int {
		n := 0
		l.legs.Range(func(_, _ any) bool { n++; return true })
		return n
	}
	down, up := net.Pipe()
	defer down.Close()
	defer up.Close()

	rec := m.open(log, trafficLabels{reporter: "source", srcWorkload: "client", srcNamespace: "demo"}, false)
	l.add(rec, connAddrs{src: netip.MustParseAddrPort("192.0.2.1:1000"), authority: "svc.demo:80",
		actualDst: netip.MustParseAddrPort("192.0.2.2:15008"), protocol: "HBONE"})
	l.bind(rec, down)
	if n := legs(); n != 1 {
		t.Fatalf("after bind %d legs held, want 1", n)
	}
	req, resp := l.counters(down, up)
	if req == nil || resp == nil {
		t.Fatal("counters of a listed, non-spliced connection are nil")
	}
	req.Add(5)
	if n := legs(); n != 0 {
		t.Errorf("after hand-off %d legs held, want 0", n)
	}
	var p Proxy
	p.live.m.Store(rec, mustLoad(t, &l, rec))
	got, total := p.LiveConnections(nil, 10)
	if total != 1 || len(got) != 1 || got[0].RequestBytes != 5 || !got[0].BytesLive || got[0].SrcWorkload != "demo/client" {
		t.Errorf("LiveConnections = %+v, %d; want one with 5 request bytes, live, from demo/client", got, total)
	}
	// The addresses, kept as values, are formatted when the view is read.
	want := ConnJSON{Src: "192.0.2.1:1000", OriginalDst: "svc.demo:80", ActualDst: "192.0.2.2:15008", Protocol: "HBONE"}
	if len(got) == 1 && (got[0].ConnJSON != want || got[0].Direction != "outbound") {
		t.Errorf("LiveConnections[0] = %+v, %s; want %+v, outbound", got[0].ConnJSON, got[0].Direction, want)
	}
	if _, out := p.Connections(); len(out) != 1 || out[0] != want {
		t.Errorf("Connections outbound = %+v, want [%+v]", out, want)
	}
	if _, total := p.LiveConnections(nil, 0); total != 1 {
		t.Errorf("LiveConnections(max 0) total = %d, want 1", total)
	}

	rec2 := m.open(log, trafficLabels{reporter: "source"}, false)
	l.add(rec2, connAddrs{})
	l.bind(rec2, up)
	l.remove(rec2) // closed before the hand-off
	if n := legs(); n != 0 {
		t.Errorf("after close %d legs held, want 0", n)
	}

	unlisted := m.open(log, trafficLabels{reporter: "source"}, false)
	l.bind(unlisted, down)
	if n := legs(); n != 0 {
		t.Errorf("an unlisted record bound %d legs", n)
	}

	a, b := tcpPair(t)
	rec3 := m.open(log, trafficLabels{reporter: "source"}, false)
	l.add(rec3, connAddrs{protocol: "TCP"})
	l.bind(rec3, a)
	if req, resp := l.counters(a, b); req != nil || resp != nil {
		t.Error("a spliced TCP pair got live counters")
	}
}

func mustLoad(t *testing.T, l *liveConns, rec *connRecord) *liveConn {
	t.Helper()
	v, ok := l.m.Load(rec)
	if !ok {
		t.Fatal("record not listed")
	}
	return v.(*liveConn)
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
