package hbone

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

var (
	testCertOnce sync.Once
	testCert     tls.Certificate
)

// selfSignedCert returns a throwaway ECDSA certificate for loopback TLS.
func selfSignedCert(t testing.TB) tls.Certificate {
	testCertOnce.Do(func() {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(1),
			Subject:      pkix.Name{CommonName: "hbone test"},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(time.Hour),
			IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			panic(err)
		}
		testCert = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	})
	return testCert
}

// tlsPair is connPair with TLS 1.3 and ALPN h2 on top, handshakes done.
func tlsPair(t testing.TB) (*tls.Conn, *tls.Conn) {
	return tlsPairOpt(t, false)
}

// tlsPairOpt is tlsPair, with BatchConns under TLS if batch.
func tlsPairOpt(t testing.TB, batch bool) (*tls.Conn, *tls.Conn) {
	t.Helper()
	var cn, sn net.Conn
	cn, sn = connPair(t, false)
	if batch {
		cn, sn = NewBatchConn(cn), NewBatchConn(sn)
	}
	cert := selfSignedCert(t)
	pool := x509.NewCertPool()
	leaf, _ := x509.ParseCertificate(cert.Certificate[0])
	pool.AddCert(leaf)
	sc := tls.Server(sn, &tls.Config{
		Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool,
	})
	cc := tls.Client(cn, &tls.Config{
		Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: "127.0.0.1",
		MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"},
	})
	errc := runAsync(func() error { return sc.Handshake() })
	if err := cc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return cc, sc
}

// TestTLS runs a tunnel over mutual TLS: the handler sees the *tls.Conn and
// the peer certificate; bytes are exact both ways.
func TestTLS(t *testing.T) {
	cn, sn := tlsPair(t)
	peer := make(chan int, 1)
	srv := &Server{Handler: func(s *ServerStream) {
		tc, ok := s.Conn().(*tls.Conn)
		if !ok {
			peer <- -1
		} else {
			peer <- len(tc.ConnectionState().PeerCertificates)
		}
		echoHandler(s)
	}}
	served := runAsync(func() error { return srv.ServeConn(context.Background(), sn) })
	cc, err := NewClientConn(context.Background(), cn, Config{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := cc.Connect(context.Background(), "127.0.0.1:80", nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := <-peer; n != 1 {
		t.Errorf("handler saw %d peer certificates (-1: not a *tls.Conn)", n)
	}
	want := payload(21, 8<<20+5)
	if err := echoExchange(s, want, 22, 128<<10); err != nil {
		t.Fatal(err)
	}
	s.Close()
	cc.Close()
	if err := <-served; err != nil {
		t.Errorf("ServeConn = %v", err)
	}
}

// BenchmarkStreamThroughputTLS is BenchmarkStreamThroughput over TLS 1.3.
func BenchmarkStreamThroughputTLS(b *testing.B) {
	b.Run("plain", func(b *testing.B) { benchTLS(b, false) })
	b.Run("batch", func(b *testing.B) { benchTLS(b, true) })
}

func benchTLS(b *testing.B, batch bool) {
	const chunk = 256 << 10
	cn, sn := tlsPairOpt(b, batch)
	done := make(chan int64, 1)
	srv := &Server{Handler: func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		defer s.Close()
		var n int64
		buf := make([]byte, 32<<10)
		for {
			k, err := s.Read(buf)
			n += int64(k)
			if err != nil {
				break
			}
		}
		done <- n
	}}
	served := runAsync(func() error { return srv.ServeConn(context.Background(), sn) })
	cc, err := NewClientConn(context.Background(), cn, Config{})
	if err != nil {
		b.Fatal(err)
	}
	s, err := cc.Connect(context.Background(), "a:1", nil)
	if err != nil {
		b.Fatal(err)
	}
	buf := payload(1, chunk)
	b.SetBytes(chunk)
	b.ResetTimer()
	for range b.N {
		if _, err := s.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	s.CloseWrite()
	<-done
	b.StopTimer()
	s.Close()
	cc.Close()
	<-served
}

// TestBatchConnTLS runs the TLS echo with BatchConns under both ends,
// including a connection whose handshake happens inside hbone's first write
// (batching must stay off for it).
func TestBatchConnTLS(t *testing.T) {
	for _, early := range []bool{false, true} {
		name := "handshake first"
		if early {
			name = "handshake in hbone"
		}
		t.Run(name, func(t *testing.T) {
			var cn, sn net.Conn
			if early {
				rc, rs := connPair(t, false)
				cert := selfSignedCert(t)
				pool := x509.NewCertPool()
				leaf, _ := x509.ParseCertificate(cert.Certificate[0])
				pool.AddCert(leaf)
				sn = tls.Server(NewBatchConn(rs), &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}})
				cn = tls.Client(NewBatchConn(rc), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", NextProtos: []string{"h2"}})
			} else {
				cn, sn = tlsPairOpt(t, true)
			}
			srv := &Server{Handler: echoHandler}
			served := runAsync(func() error { return srv.ServeConn(context.Background(), sn) })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cc, err := NewClientConn(ctx, cn, Config{})
			if err != nil {
				t.Fatal(err)
			}
			s, err := cc.Connect(ctx, "a:1", nil)
			if err != nil {
				t.Fatal(err)
			}
			want := payload(51, 4<<20+1)
			if err := echoExchange(s, want, 52, 200<<10); err != nil {
				t.Fatal(err)
			}
			s.Close()
			cc.Close()
			if err := <-served; err != nil {
				t.Errorf("ServeConn = %v", err)
			}
		})
	}
}
