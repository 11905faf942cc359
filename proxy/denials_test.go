package proxy

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

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
	ds := telemetry.NewDenials(4)
	p := &Proxy{cfg: Config{Denials: ds}}
	c := rbac.Conn{Src: netip.MustParseAddrPort("10.0.0.2:4000"), Dst: netip.MustParseAddrPort("10.0.0.3:8080"), Identity: client}

	p.noteDenial(snap, local, telemetry.ViaTCP, c, errNoLocalWorkload) // not authorization's
	authzErr := authorize(snap, local, c)
	if authzErr == nil {
		t.Fatal("authorize allowed a connection the DENY policy matches")
	}
	p.noteDenial(snap, local, telemetry.ViaTCP, c, authzErr)

	recent, _ := ds.Recent()
	if len(recent) != 1 {
		t.Fatalf("recorded %d denials, want 1: %+v", len(recent), recent)
	}
	d := recent[0]
	if d.Time.IsZero() {
		t.Error("denial has no time")
	}
	want := telemetry.Denial{Time: d.Time, Workload: "demo/server", WorkloadUID: "uid-server", Via: telemetry.ViaTCP,
		Src: c.Src, SrcIdentity: client.String(), Dst: c.Dst, Policy: "demo/deny-8080", Rule: 1,
		Reason: "denied by policy demo/deny-8080 rule 1 (destination_ports)"}
	if diff := cmp.Diff(want, d, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
		t.Errorf("denial (-want +got):\n%s", diff)
	}
}
