package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/gozt/gozt/e2e/internal/cluster"
)

// adminPort is gozt's admin server, bound to localhost in its pod.
const adminPort = 15000

// adminGet GETs path from the admin port of the gozt pod through the API
// server's port-forward, as istioctl does.
func adminGet(ctx context.Context, pod, path string) ([]byte, error) {
	transport, upgrader, err := spdy.RoundTripperFor(cl.rc)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(cl.rc.Host)
	if err != nil {
		return nil, err
	}
	u.Path = fmt.Sprintf("/api/v1/namespaces/%s/pods/%s/portforward", cluster.IstioNamespace, pod)
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	// Local port 0: the forwarder listens on a free port of its own
	// choosing, read back with GetPorts once it is ready.
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"},
		[]string{"0:" + strconv.Itoa(adminPort)}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		return nil, err
	}
	errc := make(chan error, 1)
	go func() { errc <- fw.ForwardPorts() }()
	defer func() {
		close(stop)
		<-errc
	}()
	select {
	case <-ready:
	case err := <-errc:
		errc <- err
		return nil, fmt.Errorf("port-forward %s: %w", pod, err)
	case <-time.After(20 * time.Second):
		return nil, fmt.Errorf("port-forward %s: not ready after 20s", pod)
	}
	ports, err := fw.GetPorts()
	if err != nil {
		return nil, fmt.Errorf("port-forward %s: %w", pod, err)
	}
	code, body, err := httpGet(ctx, fmt.Sprintf("http://127.0.0.1:%d%s", ports[0].Local, path))
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d %s", path, code, body)
	}
	return []byte(body), nil
}
