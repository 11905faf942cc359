package proxy

import (
	"net/netip"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gozt/gozt/state"
)

// lbWorkload is a workload for the locality tables: network, region, zone.
func lbWorkload(name, network, region, zone string, addrs ...netip.Addr) *state.Workload {
	return &state.Workload{UID: "c//Pod/ns/" + name, Name: name, Namespace: "ns", Network: network,
		Locality: state.Locality{Region: region, Zone: zone}, Addresses: addrs, Protocol: state.TunnelHBONE}
}

// candidatesOf returns the endpoints pickEndpoint chooses for src over 400
// draws: with at most a handful of equally weighted candidates, missing one
// has a probability below 1e-40.
func candidatesOf(t *testing.T, snap *state.Snapshot, svc *state.Service, src *state.Workload) []string {
	t.Helper()
	r := router{snap: snap}
	seen := map[string]bool{}
	for range 400 {
		if w, _, ok := r.pickEndpoint(svc, 80, src); ok {
			seen[w.Name] = true
		}
	}
	out := make([]string, 0, len(seen))
	for name := range seen {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// TestLocalityLoadBalancing: FAILOVER and STRICT ranking as ztunnel's
// load_balance ranks (SPEC §3.3), on ztunnel's own cases (its state.rs
// locality test) and the three defects of issue 12: a same-network match
// scores len, STRICT is checked before the network bonus, and ZONE and
// SUBZONE compare only that field.
func TestLocalityLoadBalancing(t *testing.T) {
	st := state.NewStore(state.Config{})
	n := byte(1)
	addr := func() netip.Addr { n++; return netip.AddrFrom4([4]byte{10, 1, 0, n}) }
	ws := []*state.Workload{
		lbWorkload("match", "network", "reg", "zone", addr()),
		lbWorkload("almost", "network", "reg", "not-zone", addr()),
		lbWorkload("nolocality", "network", "", "", addr()),
		lbWorkload("other", "other", "reg", "zone", addr()),
		lbWorkload("noip", "network", "reg", "zone"), // never chosen: no address
		lbWorkload("farregion", "network", "far", "zone", addr()),
		lbWorkload("remotezone", "remote", "r1", "z1", addr()),
		lbWorkload("zoneonly", "x", "elsewhere", "z1", addr()),
		lbWorkload("dnsonly", "network", "reg", "zone"), // no IP but a hostname: resolved at connect time
	}
	ws[len(ws)-1].Hostname = "db.example.com"
	type svcSpec struct {
		name  string
		mode  state.LBMode
		prefs []state.LBScope
		eps   []string
	}
	nrz := []state.LBScope{state.ScopeNetwork, state.ScopeRegion, state.ScopeZone}
	specs := []svcSpec{
		{"strict", state.LBStrict, nrz, []string{"match", "almost", "nolocality", "other", "noip"}},
		{"failover", state.LBFailover, nrz, []string{"match", "almost", "nolocality", "other", "noip"}},
		{"tie", state.LBFailover, nrz, []string{"farregion", "remotezone"}},
		{"zone", state.LBFailover, []state.LBScope{state.ScopeZone}, []string{"zoneonly", "almost"}},
		{"hostname", state.LBStandard, nil, []string{"dnsonly", "noip", "almost"}},
		{"hostnamefailover", state.LBFailover, nrz, []string{"dnsonly", "almost"}},
	}
	// Endpoints come from the workloads' service memberships.
	for _, w := range ws {
		for _, sp := range specs {
			for _, ep := range sp.eps {
				if ep == w.Name {
					if w.Services == nil {
						w.Services = map[string]state.PortMap{}
					}
					w.Services["ns/"+sp.name+".ns.svc.cluster.local"] = state.PortMap{80: 80}
				}
			}
		}
	}
	st.Update(func(b *state.Batch) {
		for _, sp := range specs {
			svc := &state.Service{Name: sp.name, Namespace: "ns", Hostname: sp.name + ".ns.svc.cluster.local",
				Ports: state.PortMap{80: 80}, LoadBalancer: &state.LoadBalancer{Mode: sp.mode, RoutingPreference: sp.prefs}}
			if err := b.InsertService(svc); err != nil {
				t.Fatal(err)
			}
		}
		for _, w := range ws {
			if err := b.InsertWorkload(w); err != nil {
				t.Fatal(err)
			}
		}
	})
	svcs := map[string]*state.Service{}
	for _, sp := range specs {
		svcs[sp.name] = nil
	}
	snap := st.Snapshot()
	for name := range svcs {
		svcs[name] = snap.ServiceByKey("ns/" + name + ".ns.svc.cluster.local")
	}
	src := func(network, region, zone string) *state.Workload { return lbWorkload("src", network, region, zone) }
	for _, tc := range []struct {
		desc string
		svc  string
		src  *state.Workload
		want []string
	}{
		{"strict, nothing matches", "strict", src("", "", ""), []string{}},
		{"strict, everything matches", "strict", src("network", "reg", "zone"), []string{"match"}},
		{"strict drops network+region without zone", "strict", src("network", "reg", "z2"), []string{}},
		{"failover, no match: any endpoint", "failover", src("no-match", "no-match", "no-match"),
			[]string{"almost", "match", "nolocality", "other"}},
		{"failover, network+region+zone", "failover", src("network", "reg", "zone"), []string{"match"}},
		{"failover, network+region", "failover", src("network", "reg", ""), []string{"almost", "match"}},
		{"failover, network only", "failover", src("network", "no-match", "no-match"),
			[]string{"almost", "match", "nolocality"}},
		{"failover, region+zone on another network", "failover", src("no-match", "reg", "zone"), []string{"match", "other"}},
		{"same network in another region beats another network in the same zone", "tie", src("network", "r1", "z1"),
			[]string{"farregion"}},
		{"ZONE compares the zone alone", "zone", src("network", "r9", "z1"), []string{"zoneonly"}},
		{"a hostname endpoint is a candidate, one with neither IP nor hostname is not", "hostname",
			src("network", "reg", "zone"), []string{"almost", "dnsonly"}},
		{"a hostname endpoint ranks by locality like any other", "hostnamefailover",
			src("network", "reg", "zone"), []string{"dnsonly"}},
	} {
		got := candidatesOf(t, snap, svcs[tc.svc], tc.src)
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s: candidates (-want +got):\n%s", tc.desc, diff)
		}
	}
}
