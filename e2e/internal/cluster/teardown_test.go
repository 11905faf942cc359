package cluster

import (
	"slices"
	"strings"
	"testing"
)

func TestUnquote(t *testing.T) {
	rule := `-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`
	got := unquote(strings.Fields(rule)[1:])
	want := []string{"PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"}
	if !slices.Equal(got, want) {
		t.Errorf("unquote = %q, want %q", got, want)
	}
}

func TestOurChains(t *testing.T) {
	for name, want := range map[string]bool{
		"KUBE-SERVICES": true, "ISTIO_POSTRT": true, "CNI-abc": true, "GOZT-E2E-GUARD": true,
		"FORWARD": false, "DOCKER": false, "LIBVIRT_INP": false,
	} {
		if got := ourChain(name); got != want {
			t.Errorf("ourChain(%q) = %v", name, got)
		}
	}
	if !jumpsToOurs(strings.Fields("-A FORWARD -j GOZT-E2E-GUARD")) || jumpsToOurs(strings.Fields("-A FORWARD -j ACCEPT")) {
		t.Error("jumpsToOurs")
	}
}

func TestNetnsName(t *testing.T) {
	if !netnsName.MatchString("cni-16e2a3de-9e63-6f18-3b8f-84fd7697da6f") {
		t.Error("containerd's sandbox namespace not matched")
	}
	for _, n := range []string{"gozt-2840491f", "cni-", "cni-16e2a3de", "mynet"} {
		if netnsName.MatchString(n) {
			t.Errorf("%q matched", n)
		}
	}
}
