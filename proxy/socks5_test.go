package proxy

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gozt/gozt/proxy/dns"
	"github.com/gozt/gozt/state"
)

// TestSOCKSHandshake feeds socksHandshake greetings and requests, whole or
// one byte per write, and checks the target, the reply code, what was
// answered, and that no byte after the request was consumed.
func TestSOCKSHandshake(t *testing.T) {
	store := state.NewStore(state.Config{})
	store.Update(func(b *state.Batch) {
		if err := b.InsertService(&state.Service{
			Name: "echo", Namespace: "demo", Hostname: "echo.demo.svc.cluster.local",
			VIPs: []state.NetworkAddress{{Address: netip.MustParseAddr("10.96.0.10")}},
		}); err != nil {
			t.Fatal(err)
		}
		if err := b.InsertWorkload(&state.Workload{UID: "Kubernetes//Pod/demo/client", Name: "client", Namespace: "demo",
			Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.99")}}); err != nil {
			t.Fatal(err)
		}
	})
	// Domain targets resolve through the DNS proxy's resolver, as the
	// client workload's queries would (no upstream: others fail).
	p := &Proxy{cfg: Config{Store: store}, lifetime: context.Background()}
	p.dns = dns.NewServer(dns.ServerConfig{
		Resolver: dns.NewResolver(dns.Config{Metrics: dns.NewMetrics(prometheus.NewRegistry())}),
		Local: func(context.Context) (*state.Snapshot, *state.Workload) {
			snap := store.Snapshot()
			return snap, snap.WorkloadByUID("Kubernetes//Pod/demo/client")
		},
	})
	noDNS := &Proxy{cfg: Config{Store: store}, lifetime: context.Background()}

	greeting := []byte{5, 1, 0}
	domain := append([]byte{5, 1, 0, 3, byte(len("echo.demo.svc.cluster.local"))}, "echo.demo.svc.cluster.local"...)
	for _, tc := range []struct {
		name      string
		p         *Proxy // nil: p
		in        []byte
		want      string // target, or "" on failure
		rep       byte
		wantReply []byte
	}{
		{"ipv4", nil, cat(greeting, []byte{5, 1, 0, 1, 10, 0, 0, 7, 0x1f, 0x90}), "10.0.0.7:8080", 0, []byte{5, 0}},
		{"ipv6", nil, cat(greeting, []byte{5, 1, 0, 4}, netip.MustParseAddr("fd00::7").AsSlice(), []byte{0, 80}), "[fd00::7]:80", 0, []byte{5, 0}},
		{"mapped ipv6", nil, cat(greeting, []byte{5, 1, 0, 4}, netip.MustParseAddr("::ffff:10.0.0.8").AsSlice(), []byte{0, 80}), "10.0.0.8:80", 0, []byte{5, 0}},
		{"domain", nil, cat(greeting, domain, []byte{0, 80}), "10.96.0.10:80", 0, []byte{5, 0}},
		{"three methods", nil, cat([]byte{5, 3, 2, 1, 0}, []byte{5, 1, 0, 1, 10, 0, 0, 7, 0, 80}), "10.0.0.7:80", 0, []byte{5, 0}},
		{"short name", nil, cat(greeting, []byte{5, 1, 0, 3, 4}, []byte("echo"), []byte{0, 80}), "10.96.0.10:80", 0, []byte{5, 0}},
		{"domain without DNS proxy", noDNS, cat(greeting, domain, []byte{0, 80}), "", socksRepNotSupp, []byte{5, 0}},
		{"unknown domain", nil, cat(greeting, []byte{5, 1, 0, 3, 3}, []byte("foo"), []byte{0, 80}), "", socksRepHostUnr, []byte{5, 0}},
		{"empty domain", nil, cat(greeting, []byte{5, 1, 0, 3, 0, 0, 80}), "", socksRepHostUnr, []byte{5, 0}},
		{"bind command", nil, cat(greeting, []byte{5, 2, 0, 1, 10, 0, 0, 7, 0, 80}), "", socksRepNotSupp, []byte{5, 0}},
		{"bad atyp", nil, cat(greeting, []byte{5, 1, 0, 9, 1}), "", socksRepNotSupp, []byte{5, 0}},
		{"request version", nil, cat(greeting, []byte{4, 1, 0, 1, 1}), "", socksRepNotSupp, []byte{5, 0}},
		{"no no-auth", nil, []byte{5, 1, 2}, "", 0, []byte{5, 0xff}},
		{"zero methods", nil, []byte{5, 0, 0}, "", 0, []byte{5, 0xff}},
		{"socks4", nil, []byte{4, 1, 0, 80}, "", 0, nil},
	} {
		for _, trickle := range []bool{false, true} {
			name := tc.name
			if trickle {
				name += "/trickle"
			}
			t.Run(name, func(t *testing.T) {
				client, server := net.Pipe()
				defer client.Close()
				defer server.Close()
				server.SetDeadline(time.Now().Add(5 * time.Second))
				payload := []byte("early payload")
				go func() {
					in := cat(tc.in, payload)
					if !trickle {
						client.Write(in)
						return
					}
					for i := range in {
						if _, err := client.Write(in[i : i+1]); err != nil {
							return
						}
					}
				}()
				var reply bytes.Buffer
				replied := make(chan struct{})
				go func() {
					defer close(replied)
					buf := make([]byte, 2)
					if _, err := io.ReadFull(client, buf); err == nil {
						reply.Write(buf)
					}
				}()
				px := p
				if tc.p != nil {
					px = tc.p
				}
				dst, rep, err := px.socksHandshake(server)
				if tc.want == "" {
					if err == nil || rep != tc.rep {
						t.Errorf("socksHandshake = %v, rep %d, %v; want an error with rep %d", dst, rep, err, tc.rep)
					}
				} else if err != nil || dst.String() != tc.want {
					t.Errorf("socksHandshake = %v, %v; want %s", dst, err, tc.want)
				}
				if tc.wantReply != nil {
					<-replied
					if !bytes.Equal(reply.Bytes(), tc.wantReply) {
						t.Errorf("method reply %x, want %x", reply.Bytes(), tc.wantReply)
					}
				}
				if err != nil {
					return
				}
				got := make([]byte, len(payload))
				if _, err := io.ReadFull(server, got); err != nil || !bytes.Equal(got, payload) {
					t.Errorf("after the request the socket holds %q (%v), want %q untouched", got, err, payload)
				}
			})
		}
	}
}

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
