package state

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/gozt/gozt/rbac"
)

// TestLookupsDoNotAllocate is STYLE rule 38: per-connection lookups
// allocate nothing.
func TestLookupsDoNotAllocate(t *testing.T) {
	st := NewStore(Config{})
	update(t, st, func(b *Batch, must func(error)) {
		for i := range 50 {
			w := pod("ns", fmt.Sprintf("w%d", i), fmt.Sprintf("10.0.%d.%d", i/250, i%250+1))
			w.Services = map[string]PortMap{"ns/s": {80: 8080}}
			must(b.InsertWorkload(w))
		}
		must(b.InsertService(svc("ns", "s", vip("", "10.96.0.1"))))
		must(b.InsertService(svc("other", "s", vip("", "10.96.0.1"))))
		c := svc("ns", "c")
		c.CIDRVIPs = []NetworkPrefix{cidr("", "10.200.0.0/16")}
		must(b.InsertService(c))
		must(b.InsertPolicy(policy("ns", "p", rbac.Namespace)))
		must(b.InsertPolicy(policy("ns", "g", rbac.Global)))
	})
	snap := st.Snapshot()
	wip, vipAddr, cidrAddr := ip("10.0.0.7"), ip("10.96.0.1"), ip("10.200.3.4")
	mapped := netip.AddrFrom16(vipAddr.As16())
	tests := []struct {
		name string
		fn   func() bool
	}{
		{"WorkloadByIP", func() bool { return snap.WorkloadByIP("", wip) != nil }},
		{"ServiceByVIP exact", func() bool { return snap.ServiceByVIP("", vipAddr, "zz") != nil }},
		{"ServiceByVIP mapped", func() bool { return snap.ServiceByVIP("", mapped, "ns") != nil }},
		{"ServiceByVIP cidr", func() bool { return snap.ServiceByVIP("", cidrAddr, "ns") != nil }},
		{"ServiceByVIP miss", func() bool { return snap.ServiceByVIP("", ip("1.2.3.4"), "ns") == nil }},
		{"WorkloadByUID", func() bool { return snap.WorkloadByUID("c1//Pod/ns/w3") != nil }},
		{"FindWorkload", func() bool { return snap.FindWorkload("", "ns", "w3", "default") != nil }},
		{"WorkloadsByName", func() bool {
			for w := range snap.WorkloadsByName("w3") {
				return w != nil
			}
			return false
		}},
		{"ServiceByKey", func() bool { return snap.ServiceByKey("ns/s") != nil }},
		{"NamespacePolicies", func() bool { return len(snap.NamespacePolicies("ns")) == 1 }},
		{"GlobalPolicies", func() bool { return len(snap.GlobalPolicies()) == 1 }},
		{"Policy", func() bool { return snap.Policy("ns/p") != nil }},
		{"Store.Snapshot", func() bool { return st.Snapshot() != nil }},
	}
	for _, tt := range tests {
		if !tt.fn() {
			t.Errorf("%s: lookup did not find what it should", tt.name)
		}
		if n := testing.AllocsPerRun(100, func() { tt.fn() }); n != 0 {
			t.Errorf("%s: %v allocs per run, want 0", tt.name, n)
		}
	}
}

func BenchmarkWorkloadByIP(b *testing.B) {
	st := NewStore(Config{})
	st.Update(func(bt *Batch) {
		for i := range 10000 {
			_ = bt.InsertWorkload(pod("ns", fmt.Sprintf("w%d", i), fmt.Sprintf("10.%d.%d.1", i/250, i%250)))
		}
	})
	snap := st.Snapshot()
	a := ip("10.20.20.1")
	b.ReportAllocs()
	for b.Loop() {
		if snap.WorkloadByIP("", a) == nil {
			b.Fatal("not found")
		}
	}
}

// BenchmarkUpdate10k applies 10,000 workloads and 1,000 services in one
// batch, each workload an endpoint of one service.
func BenchmarkUpdate10k(b *testing.B) {
	workloads := make([]*Workload, 10000)
	for i := range workloads {
		w := pod("ns", fmt.Sprintf("w%d", i), fmt.Sprintf("10.%d.%d.%d", i/62500, i/250%250, i%250+1))
		w.Protocol = TunnelHBONE
		w.Services = map[string]PortMap{fmt.Sprintf("ns/s%d.example", i%1000): {80: 8080}}
		workloads[i] = w
	}
	services := make([]*Service, 1000)
	for i := range services {
		services[i] = svc("ns", fmt.Sprintf("s%d.example", i), vip("", fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)))
	}
	b.ReportAllocs()
	for b.Loop() {
		st := NewStore(Config{})
		st.Update(func(bt *Batch) {
			for _, w := range workloads {
				if err := bt.InsertWorkload(w); err != nil {
					b.Fatal(err)
				}
			}
			for _, s := range services {
				if err := bt.InsertService(s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkUpdateOneOf10k changes one workload in a store of 10,000: the
// steady-state xDS push.
func BenchmarkUpdateOneOf10k(b *testing.B) {
	st := NewStore(Config{})
	st.Update(func(bt *Batch) {
		for i := range 10000 {
			w := pod("ns", fmt.Sprintf("w%d", i), fmt.Sprintf("10.%d.%d.1", i/250, i%250))
			w.Services = map[string]PortMap{fmt.Sprintf("ns/s%d.example", i%1000): {80: 8080}}
			_ = bt.InsertWorkload(w)
		}
		for i := range 1000 {
			_ = bt.InsertService(svc("ns", fmt.Sprintf("s%d.example", i)))
		}
	})
	w := pod("ns", "w5", "10.0.5.1")
	w.Services = map[string]PortMap{"ns/s5.example": {80: 9090}}
	b.ReportAllocs()
	for b.Loop() {
		st.Update(func(bt *Batch) { _ = bt.InsertWorkload(w) })
	}
}
