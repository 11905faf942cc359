package local

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// startParkMesh is startMesh on addresses of 127.95.n.0/24 (its VIP on
// 127.95.n+1.0/24).
func startParkMesh(t *testing.T, n int) *testMesh {
	t.Helper()
	ips := meshIPsIn(95, n)
	vip := strings.Replace(ips.Client, fmt.Sprintf(".%d.", n), fmt.Sprintf(".%d.", n+1), 1)
	data := struct {
		meshIPs
		VIP string
	}{ips, vip}
	m, logs := startConfig(t, baseConfig, data, Options{})
	return &testMesh{Mesh: m, ips: ips, vip: vip, logs: logs}
}

// waitParked waits until the mesh's proxies have n idle connections parked
// (no goroutine) between them.
func waitParked(t *testing.T, tm *testMesh, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := 0
		for _, p := range tm.proxies {
			got += p.ParkedConns()
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections parked, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPolicyChangeClosesParkedConnection is TestPolicyChangeClosesLiveConnection
// with both connections idle and parked in both proxies: the DENY still
// closes the victim, and the other wakes and flows.
func TestPolicyChangeClosesParkedConnection(t *testing.T) {
	tm := startParkMesh(t, 10)
	victim, other := victimAndOther(t, tm)
	waitParked(t, tm, 4) // each connection in the outbound and the inbound proxy

	setPolicy(t, tm.Store(), denyClient8080(), false)
	victim.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := victim.Read(make([]byte, 1)); err == nil {
		t.Fatal("denied parked connection still delivers data")
	}
	waitParked(t, tm, 2)
	for range 3 {
		roundTrip(t, other)
	}
	waitLog(t, tm, "policy change")
}

// TestShutdownEndsParkedConnections: a drain of the client's proxy that runs
// out force-closes its connections, whose legs are parked, and Shutdown
// returns. The server's proxy stays up, so nothing from the other side of
// the tunnels ends them.
func TestShutdownEndsParkedConnections(t *testing.T) {
	tm := startParkMesh(t, 12)
	listenBackend(t, tm.ips.Server+":8080", echoHandler)
	var conns []net.Conn
	for range 3 {
		c := tm.socksDial(t, tm.ips.Server+":8080")
		defer c.Close()
		roundTrip(t, c)
		conns = append(conns, c)
	}
	waitParked(t, tm, 6)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	client := tm.proxies[0]
	for _, p := range tm.proxies {
		if strings.HasSuffix(p.UID(), "/client") {
			client = p
		}
	}
	go func() { done <- client.Shutdown(ctx) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return with parked connections")
	}
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Errorf("connection %d still delivers data after the shutdown", i)
		}
	}
}
