package local

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// EchoServer is the demo backend: it answers every HTTP request with the
// source address it saw, which shows that the mesh preserved the client IP.
type EchoServer struct {
	srv *http.Server
	ln  net.Listener
	wg  sync.WaitGroup
}

// ListenEcho starts the demo echo backend on addr.
func ListenEcho(addr string) (*EchoServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("demo echo backend: listen %s: %w", addr, err)
	}
	e := &EchoServer{ln: ln, srv: &http.Server{
		ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "hello from gozt demo echo: you are %s\n", r.RemoteAddr)
		}),
	}}
	e.wg.Add(1)
	go e.serve()
	return e, nil
}

func (e *EchoServer) serve() {
	defer e.wg.Done()
	if err := e.srv.Serve(e.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return
	}
}

// Close stops the backend and waits for it.
func (e *EchoServer) Close() error {
	err := e.srv.Close()
	e.wg.Wait()
	return err
}
