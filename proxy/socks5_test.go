package proxy

import (
	"bytes"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/gozt/gozt/proxy/state"
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
	})
	p := &Proxy{cfg: Config{Store: store}}

	greeting := []byte{5, 1, 0}
	domain := append([]byte{5, 1, 0, 3, byte(len("echo.demo.svc.cluster.local"))}, "echo.demo.svc.cluster.local"...)
	for _, tc := range []struct {
		name      string
		in        []byte
		want      string // target, or "" on failure
		rep       byte
		wantReply []byte
	}{
		{"ipv4", cat(greeting, []byte{5, 1, 0, 1, 10, 0, 0, 7, 0x1f, 0x90}), "10.0.0.7:8080", 0, []byte{5, 0}},
		{"ipv6", cat(greeting, []byte{5, 1, 0, 4}, netip.MustParseAddr("fd00::7").AsSlice(), []byte{0, 80}), "[fd00::7]:80", 0, []byte{5, 0}},
		{"mapped ipv6", cat(greeting, []byte{5, 1, 0, 4}, netip.MustParseAddr("::ffff:10.0.0.8").AsSlice(), []byte{0, 80}), "10.0.0.8:80", 0, []byte{5, 0}},
		{"domain", cat(greeting, domain, []byte{0, 80}), "10.96.0.10:80", 0, []byte{5, 0}},
		{"three methods", cat([]byte{5, 3, 2, 1, 0}, []byte{5, 1, 0, 1, 10, 0, 0, 7, 0, 80}), "10.0.0.7:80", 0, []byte{5, 0}},
		{"unknown domain", cat(greeting, []byte{5, 1, 0, 3, 3}, []byte("foo"), []byte{0, 80}), "", socksRepHostUnr, []byte{5, 0}},
		{"empty domain", cat(greeting, []byte{5, 1, 0, 3, 0, 0, 80}), "", socksRepHostUnr, []byte{5, 0}},
		{"bind command", cat(greeting, []byte{5, 2, 0, 1, 10, 0, 0, 7, 0, 80}), "", socksRepNotSupp, []byte{5, 0}},
		{"bad atyp", cat(greeting, []byte{5, 1, 0, 9, 1}), "", socksRepNotSupp, []byte{5, 0}},
		{"request version", cat(greeting, []byte{4, 1, 0, 1, 1}), "", socksRepNotSupp, []byte{5, 0}},
		{"no no-auth", []byte{5, 1, 2}, "", 0, []byte{5, 0xff}},
		{"zero methods", []byte{5, 0, 0}, "", 0, []byte{5, 0xff}},
		{"socks4", []byte{4, 1, 0, 80}, "", 0, nil},
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
				dst, rep, err := p.socksHandshake(server)
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
