package hbone

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestEchoBothWays sends 16 MiB of seeded random bytes each way at once,
// through an echoing server, and compares them byte for byte.
func TestEchoBothWays(t *testing.T) {
	for _, pipe := range []bool{false, true} {
		name := "tcp"
		if pipe {
			name = "pipe"
		}
		t.Run(name, func(t *testing.T) {
			p := newPair(t, echoHandler, pairOpts{pipe: pipe})
			s := p.connect(context.Background())
			defer s.Close()
			want := payload(1, 16<<20)
			if err := echoExchange(s, want, 2, 256<<10); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestHalfCloseFromClient: the client CloseWrites after N bytes; the server
// reads EOF exactly at N while it is still writing its reply, which then
// arrives whole.
func TestHalfCloseFromClient(t *testing.T) {
	const n, m = 3<<20 + 17, 5<<20 + 3
	req, resp := payload(3, n), payload(4, m)
	srvErr := make(chan error, 1)
	p := newPair(t, func(s *ServerStream) {
		if err := s.Respond(http.StatusOK, nil); err != nil {
			srvErr <- err
			return
		}
		defer s.Close()
		// Write the reply concurrently with reading the request.
		wr := runAsync(func() error {
			if err := writeChunks(s, resp, 5, 100<<10); err != nil {
				return err
			}
			return s.CloseWrite()
		})
		err := readAllCompare(s, req)
		if werr := <-wr; err == nil {
			err = werr
		}
		srvErr <- err
	}, pairOpts{})
	s := p.connect(context.Background())
	defer s.Close()
	w := runAsync(func() error {
		if err := writeChunks(s, req, 6, 64<<10); err != nil {
			return err
		}
		return s.CloseWrite()
	})
	if err := readAllCompare(s, resp); err != nil {
		t.Fatalf("client read: %v", err)
	}
	wait(t, w, "client write")
	wait(t, srvErr, "server")
}

// TestHalfCloseFromServer: the server CloseWrites first; the client reads EOF
// and keeps sending; the server receives everything.
func TestHalfCloseFromServer(t *testing.T) {
	const n, m = 4<<20 + 1, 1<<20 + 5
	req, resp := payload(7, n), payload(8, m)
	srvErr := make(chan error, 1)
	p := newPair(t, func(s *ServerStream) {
		if err := s.Respond(http.StatusOK, nil); err != nil {
			srvErr <- err
			return
		}
		defer s.Close()
		if err := writeChunks(s, resp, 9, 50<<10); err != nil {
			srvErr <- err
			return
		}
		if err := s.CloseWrite(); err != nil {
			srvErr <- err
			return
		}
		srvErr <- readAllCompare(s, req)
	}, pairOpts{})
	s := p.connect(context.Background())
	defer s.Close()
	if err := readAllCompare(s, resp); err != nil {
		t.Fatalf("client read: %v", err)
	}
	// After EOF the client keeps sending.
	if err := writeChunks(s, req, 10, 300<<10); err != nil {
		t.Fatalf("client write after EOF: %v", err)
	}
	if err := s.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	wait(t, srvErr, "server")
}

func TestStatusError(t *testing.T) {
	p := newPair(t, func(s *ServerStream) {
		s.Respond(http.StatusForbidden, http.Header{"X-Reason": {"no"}})
	}, pairOpts{})
	_, err := p.cc.Connect(context.Background(), "10.0.0.1:80", nil)
	var se *StatusError
	if !errors.As(err, &se) || se.Code != http.StatusForbidden {
		t.Fatalf("Connect error = %v, want *StatusError 403", err)
	}
	if got, want := err.Error(), "hbone: CONNECT answered 403"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	// The stream was released on both sides.
	waitFor(t, func() bool { return p.cc.ActiveStreams() == 0 }, "client stream released")
}

// TestCancelIsEOF: Close on one side resets with CANCEL, which the other
// side reads as EOF after the bytes already sent.
func TestCancelIsEOF(t *testing.T) {
	got := make(chan error, 1)
	p := newPair(t, func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		defer s.Close()
		b, err := io.ReadAll(s)
		if err == nil && string(b) != "hello" {
			err = errors.New("got " + string(b))
		}
		if err == nil {
			_, err = s.Write([]byte("x"))
			if err == nil {
				err = errors.New("write after CANCEL succeeded")
			} else {
				err = nil
			}
		}
		got <- err
	}, pairOpts{})
	s := p.connect(context.Background())
	s.Write([]byte("hello"))
	// Give the DATA a head start, then reset.
	time.Sleep(10 * time.Millisecond)
	s.Close()
	wait(t, got, "server")
	if _, err := s.Read(make([]byte, 1)); err == nil {
		t.Errorf("Read after Close succeeded")
	}
}

// TestResetWithErrorCode: a reset with an error code other than
// NO_ERROR/CANCEL surfaces as *ResetError.
func TestResetWithErrorCode(t *testing.T) {
	p := newPair(t, func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		s.resetLocal(http2.ErrCodeInternal)
		s.Close()
	}, pairOpts{})
	s := p.connect(context.Background())
	defer s.Close()
	_, err := io.ReadAll(s)
	var re *ResetError
	if !errors.As(err, &re) || re.Code != http2.ErrCodeInternal || !re.Remote {
		t.Fatalf("ReadAll error = %v, want remote *ResetError INTERNAL_ERROR", err)
	}
}

func waitFor(t testing.TB, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestCopyInterfaces: io.Copy through WriteTo and ReadFrom moves bytes
// exactly, including past the buffer growth thresholds.
func TestCopyInterfaces(t *testing.T) {
	p := newPair(t, func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		defer s.Close()
		io.Copy(s, s) // WriteTo, chunks written straight into the stream
		s.CloseWrite()
		s.Read(make([]byte, 1))
	}, pairOpts{})
	s := p.connect(context.Background())
	defer s.Close()
	want := payload(31, 12<<20+9)
	w := runAsync(func() error {
		n, err := io.Copy(s, struct{ io.Reader }{bytes.NewReader(want)}) // ReadFrom
		if err == nil && n != int64(len(want)) {
			err = errors.New("short copy")
		}
		if err != nil {
			return err
		}
		return s.CloseWrite()
	})
	var got bytes.Buffer
	if _, err := io.Copy(&got, s); err != nil { // WriteTo
		t.Fatal(err)
	}
	wait(t, w, "write")
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("got %d bytes, want %d (or content differs)", got.Len(), len(want))
	}
}

// TestAfterReset: AfterReset's f runs once when the peer resets the stream,
// here with CANCEL, which reads as EOF, or at once when it already has; a
// stream that ends without a reset never runs it.
func TestAfterReset(t *testing.T) {
	calls := make(chan string, 4)
	hooked := make(chan struct{})
	p := newPair(t, func(s *ServerStream) {
		s.Respond(http.StatusOK, nil)
		defer s.Close()
		mode := s.Header().Get("Mode")
		s.AfterReset(func() {
			calls <- mode + " before"
			if mode == "reset" {
				close(hooked)
			}
		})
		io.Copy(io.Discard, s) // until EOF
		if mode == "reset" {
			<-hooked
			s.AfterReset(func() { calls <- "reset after" })
			return
		}
		s.CloseWrite()
	}, pairOpts{})

	s := p.connect(context.Background())
	s.CloseWrite()
	io.Copy(io.Discard, s)
	s.Close() // both directions ended: no reset

	s, err := p.cc.Connect(context.Background(), "10.0.0.1:8080", http.Header{"Mode": {"reset"}})
	if err != nil {
		t.Fatal(err)
	}
	s.Close() // RST_STREAM CANCEL
	var got []string
	for range 2 {
		select {
		case c := <-calls:
			got = append(got, c)
		case <-time.After(10 * time.Second):
			t.Fatalf("AfterReset calls %q, want two", got)
		}
	}
	if want := []string{"reset before", "reset after"}; !slices.Equal(got, want) {
		t.Errorf("AfterReset calls %q, want %q", got, want)
	}
	p.cc.Close()
	select {
	case err := <-p.served:
		p.served <- err // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("ServeConn did not return")
	}
	if len(calls) > 0 {
		t.Errorf("AfterReset ran for a stream that was not reset: %q", <-calls)
	}
}

// TestDropHeader: a handler that has read the request's header can drop it,
// and a client the response's, so a long tunnel does not keep them; Header
// and ResponseHeader are empty afterwards.
func TestDropHeader(t *testing.T) {
	got := make(chan [2]string, 1)
	p := newPair(t, func(s *ServerStream) {
		before := s.Header().Get("Baggage")
		s.DropHeader()
		after := s.Header().Get("Baggage")
		got <- [2]string{before, after}
		s.Respond(http.StatusOK, http.Header{"Baggage": {"k8s.namespace.name=srv"}})
		s.Close()
	}, pairOpts{pipe: true})
	s, err := p.cc.Connect(context.Background(), "10.0.0.1:8080", http.Header{"Baggage": {"k8s.namespace.name=demo"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	before := s.ResponseHeader().Get("Baggage")
	s.DropHeader()
	if after := s.ResponseHeader().Get("Baggage"); before != "k8s.namespace.name=srv" || after != "" {
		t.Errorf("ResponseHeader before and after DropHeader = %q, %q, want the value, then none", before, after)
	}
	select {
	case g := <-got:
		if g != [2]string{"k8s.namespace.name=demo", ""} {
			t.Errorf("Header before and after DropHeader = %q, want the value, then none", g)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not run")
	}
}
