package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
)

// haproxy starts HAProxy in TCP mode in front of the passthrough
// destination, or returns why it cannot. The configuration is HAProxy's
// defaults apart from timeouts and connection limits: no kernel splicing
// (option splice-*), threads as many as CPUs.
func (e *env) haproxy(ctx context.Context) (*child, error) {
	path := e.opts.haproxy
	if path == "" {
		var err error
		if path, err = exec.LookPath("haproxy"); err != nil {
			return nil, errors.New("haproxy is not installed (make bench-deps installs it)")
		}
	}
	listen := ap(e.plan.haproxy, appPort).String()
	cfg := fmt.Sprintf(`# Written by gozt bench.
global
    maxconn 4000
defaults
    mode tcp
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend bench
    bind %s
    default_backend app
backend app
    server app %s
`, listen, ap(e.plan.plain, appPort))
	file, err := writeFile(e.tmp, "haproxy.cfg", cfg)
	if err != nil {
		return nil, err
	}
	c, err := startProgram(ctx, "haproxy", path, []string{"-f", file, "-db"}, func(ctx context.Context) error {
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", listen)
		if err == nil {
			conn.Close()
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	e.all = append(e.all, c)
	return c, nil
}
