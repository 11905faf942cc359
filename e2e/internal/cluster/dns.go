package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/clientcmd"
)

// ServeDNS answers the cluster domain on addr (UDP and TCP) until ctx ends:
// A records for <service>.<namespace>.svc.<domain> (the ClusterIP, or the
// ready endpoints' addresses of a headless Service), NXDOMAIN for other
// names in the domain, and REFUSED for every name outside it, so that
// nothing in the cluster resolves, or reaches, anything off this machine.
// It stands in for the cluster DNS add-on, whose image cannot be pulled
// here.
func ServeDNS(ctx context.Context, kubeconfig, addr string) error {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	f := informers.NewSharedInformerFactory(cs, 10*time.Minute)
	h := &dnsHandler{svcs: f.Core().V1().Services().Lister(), eps: f.Core().V1().Endpoints().Lister()}
	f.Start(ctx.Done())
	defer f.Shutdown()
	f.WaitForCacheSync(ctx.Done())

	errc := make(chan error, 2)
	servers := []*dns.Server{{Addr: addr, Net: "udp", Handler: h}, {Addr: addr, Net: "tcp", Handler: h}}
	for _, s := range servers {
		go func() { errc <- s.ListenAndServe() }()
	}
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	for _, s := range servers {
		s.Shutdown()
	}
	return err
}

type dnsHandler struct {
	svcs listersv1.ServiceLister
	eps  listersv1.EndpointsLister
}

func (h *dnsHandler) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	if len(req.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		w.WriteMsg(m)
		return
	}
	q := req.Question[0]
	ips, err := h.lookup(strings.ToLower(q.Name))
	switch {
	case errors.Is(err, errOutside):
		m.Authoritative = false
		m.Rcode = dns.RcodeRefused
	case err != nil:
		m.Rcode = dns.RcodeNameError
	case q.Qtype == dns.TypeA:
		for _, ip := range ips {
			m.Answer = append(m.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5},
				A:   ip,
			})
		}
	}
	w.WriteMsg(m)
}

var (
	errOutside  = errors.New("outside the cluster domain")
	errNotFound = errors.New("no such service")
)

// lookup resolves a fully qualified name in the cluster domain.
func (h *dnsHandler) lookup(name string) ([]net.IP, error) {
	suffix := ".svc." + ClusterDomain + "."
	if !strings.HasSuffix(name, "."+ClusterDomain+".") {
		return nil, errOutside
	}
	parts := strings.Split(strings.TrimSuffix(name, suffix), ".")
	if !strings.HasSuffix(name, suffix) || len(parts) != 2 {
		return nil, errNotFound
	}
	svc, err := h.svcs.Services(parts[1]).Get(parts[0])
	if err != nil {
		return nil, errNotFound
	}
	if svc.Spec.ClusterIP != "" && svc.Spec.ClusterIP != corev1.ClusterIPNone {
		return []net.IP{net.ParseIP(svc.Spec.ClusterIP).To4()}, nil
	}
	ep, err := h.eps.Endpoints(parts[1]).Get(parts[0])
	if err != nil {
		return nil, errNotFound
	}
	var ips []net.IP
	for _, s := range ep.Subsets {
		for _, a := range s.Addresses {
			if ip := net.ParseIP(a.IP).To4(); ip != nil {
				ips = append(ips, ip)
			}
		}
	}
	return ips, nil
}

func (c *Config) startDNS(nodeIP string) error {
	args := []string{"dns", "-kubeconfig", fmt.Sprintf("%s/admin.kubeconfig", pkiDir()), "-addr", net.JoinHostPort(nodeIP, "53")}
	return c.start("dns", c.bin("gozt-e2e"), args, nil)
}
