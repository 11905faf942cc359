//lint:file-ignore SA1019 x/net's http2.Server and http2.Transport (deprecated in favour of net/http) are deliberately used as independent HTTP/2 peers.

package hbone

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestInteropXNetTransport: x/net's http2.Transport, an implementation we did
// not write, CONNECTs through our Server and exchanges bytes both ways.
func TestInteropXNetTransport(t *testing.T) {
	gotAuthority := make(chan string, 1)
	srv := &Server{Handler: func(s *ServerStream) {
		gotAuthority <- s.Authority() + " " + s.Header().Get("X-Test")
		echoHandler(s)
	}}
	cn, sn := connPair(t, false)
	served := runAsync(func() error { return srv.ServeConn(context.Background(), sn) })

	tr := &http2.Transport{}
	xcc, err := tr.NewClientConn(cn)
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	req := &http.Request{
		Method: http.MethodConnect,
		URL:    &url.URL{Host: "10.1.2.3:8080"},
		Host:   "10.1.2.3:8080",
		Header: http.Header{"X-Test": {"yes"}},
		Body:   pr,
	}
	resp, err := xcc.RoundTrip(req)
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := <-gotAuthority; got != "10.1.2.3:8080 yes" {
		t.Errorf("server saw authority and header %q", got)
	}
	want := payload(11, 3<<20+7)
	w := runAsync(func() error {
		if err := writeChunks(pw, want, 12, 40<<10); err != nil {
			return err
		}
		return pw.Close()
	})
	if err := readAllCompare(resp.Body, want); err != nil {
		t.Fatalf("echo: %v", err)
	}
	wait(t, w, "write")
	resp.Body.Close()
	xcc.Close()
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("ServeConn did not return")
	}
}

// TestInteropXNetServer: our ClientConn CONNECTs through x/net's
// http2.Server, whose handler answers 200 and echoes until the request body
// ends (it stays until both sides are done, since x/net resets a stream whose
// handler returns while the client still sends).
func TestInteropXNetServer(t *testing.T) {
	cn, sn := connPair(t, false)
	xs := &http2.Server{}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect || r.Host != "svc.ns:80" || r.Header.Get("Baggage") != "k=v" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.Header().Set("X-Reply", "ok")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Body.Read(buf)
			if n > 0 {
				w.Write(buf[:n])
				w.(http.Flusher).Flush()
			}
			if err != nil {
				return
			}
		}
	})
	served := make(chan struct{})
	go func() {
		defer close(served)
		xs.ServeConn(sn, &http2.ServeConnOpts{Handler: handler})
	}()
	cc, err := NewClientConn(context.Background(), cn, Config{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := cc.Connect(context.Background(), "svc.ns:80", http.Header{"Baggage": {"k=v"}})
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	if got := s.ResponseHeader().Get("X-Reply"); got != "ok" {
		t.Errorf("response header X-Reply = %q", got)
	}
	want := payload(13, 2<<20+3)
	if err := echoExchange(s, want, 14, 100<<10); err != nil {
		t.Fatalf("echo: %v", err)
	}
	s.Close()
	cc.Close()
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("x/net ServeConn did not return")
	}
}

// TestInteropXNetTransportCancels: x/net's http2.Transport, which counts a
// stream it canceled (RST_STREAM CANCEL) as gone, opens and cancels many
// tunnels within our MaxConcurrentStreams while the handler still holds the
// canceled streams: none is refused, and a long tunnel beside them lives.
func TestInteropXNetTransportCancels(t *testing.T) {
	const limit = 2
	srv := &Server{Config: Config{MaxConcurrentStreams: limit}, Handler: heldHandler(t)}
	cn, sn := connPair(t, false)
	served := runAsync(func() error { return srv.ServeConn(context.Background(), sn) })
	// Strict: wait for a free slot rather than fail at the limit.
	xcc, err := (&http2.Transport{StrictMaxConcurrentStreams: true}).NewClientConn(cn)
	if err != nil {
		t.Fatal(err)
	}
	connect := func(ctx context.Context, body io.Reader, h http.Header) (*http.Response, error) {
		return xcc.RoundTrip((&http.Request{
			Method: http.MethodConnect,
			URL:    &url.URL{Host: "10.1.2.3:8080"},
			Host:   "10.1.2.3:8080",
			Header: h,
			Body:   io.NopCloser(body),
		}).WithContext(ctx))
	}
	pr, pw := io.Pipe()
	long, err := connect(context.Background(), pr, http.Header{"Mode": {"echo"}})
	if err != nil {
		t.Fatalf("long tunnel: %v", err)
	}
	for i := range 3 * maxLocalResets / 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := connect(ctx, eofAfterCancel{ctx}, nil)
		if err != nil {
			cancel()
			t.Fatalf("tunnel %d: %v", i, err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("tunnel %d: status %d", i, resp.StatusCode)
		}
		cancel() // RST_STREAM CANCEL
		resp.Body.Close()
	}
	w := runAsync(func() error {
		if _, err := pw.Write([]byte("still here")); err != nil {
			return err
		}
		return pw.Close()
	})
	if err := readAllCompare(long.Body, []byte("still here")); err != nil {
		t.Fatalf("long tunnel after the cancels: %v", err)
	}
	wait(t, w, "write")
	long.Body.Close()
	xcc.Close()
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("ServeConn did not return")
	}
}

// eofAfterCancel is a request body that sends nothing and ends when ctx does.
type eofAfterCancel struct{ ctx context.Context }

func (b eofAfterCancel) Read([]byte) (int, error) {
	<-b.ctx.Done()
	return 0, io.EOF
}
