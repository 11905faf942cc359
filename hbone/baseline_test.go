//lint:file-ignore SA1019 x/net's http2.Server and http2.Transport (deprecated in favour of net/http) are deliberately used as independent HTTP/2 peers.

package hbone

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"testing"

	"golang.org/x/net/http2"
)

// BenchmarkBaselineTLS is raw TLS 1.3 over loopback, for comparison with
// BenchmarkStreamThroughputTLS.
func BenchmarkBaselineTLS(b *testing.B) {
	const chunk = 256 << 10
	cn, sn := tlsPair(b)
	done := runAsync(func() error {
		_, err := io.Copy(io.Discard, sn)
		return err
	})
	buf := payload(1, chunk)
	b.SetBytes(chunk)
	b.ResetTimer()
	for range b.N {
		if _, err := cn.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	cn.CloseWrite()
	<-done
	b.StopTimer()
	cn.Close()
	sn.Close()
}

// BenchmarkBaselineXNet is one CONNECT tunnel between x/net's Transport and
// Server over TLS, for comparison with BenchmarkStreamThroughputTLS.
func BenchmarkBaselineXNet(b *testing.B) {
	const chunk = 256 << 10
	cn, sn := tlsPair(b)
	done := make(chan int64, 1)
	xs := &http2.Server{}
	served := make(chan struct{})
	go func() {
		defer close(served)
		xs.ServeConn(sn, &http2.ServeConnOpts{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			n, _ := io.Copy(io.Discard, r.Body)
			done <- n
		})})
	}()
	xcc, err := (&http2.Transport{}).NewClientConn(cn)
	if err != nil {
		b.Fatal(err)
	}
	pr, pw := io.Pipe()
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Host: "a:1"}, Host: "a:1", Header: http.Header{}, Body: pr}
	req = req.WithContext(context.Background())
	resp, err := xcc.RoundTrip(req)
	if err != nil {
		b.Fatal(err)
	}
	buf := payload(1, chunk)
	b.SetBytes(chunk)
	b.ResetTimer()
	for range b.N {
		if _, err := pw.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	pw.Close()
	<-done
	b.StopTimer()
	resp.Body.Close()
	xcc.Close()
	cn.Close()
	<-served
}
