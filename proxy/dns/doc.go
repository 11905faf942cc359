// Package dns is the DNS proxy of each workload (SPEC §10.1): UDP and TCP
// listeners on port 15053 answer the names of mesh services from state, as
// ztunnel does, and forward every other query to the upstream servers of
// gozt's resolv.conf. github.com/miekg/dns packs and unpacks the messages;
// the package serves its sockets with loops of its own (udp.go,
// tcpconns.go), one per socket.
//
// A Resolver is shared by a node: the cluster domain, the upstreams, the
// metrics (NewMetrics registers the istio_dns_* metrics of SPEC §7.2) and
// the per-query DEBUG log (scope dns, SPEC §7.3). A Server is one
// workload's: its listeners, made in the workload's network namespace in
// shared mode, the workload its queries come from, and the sockets of its
// upstream queries (same namespace, with the mark). LookupIP resolves
// through the same path for SOCKS5 domain targets (SPEC §10.2).
//
//	m := dns.NewMetrics(reg)
//	r := dns.NewResolver(dns.Config{Upstreams: rc.Servers, Metrics: m})
//	s := dns.NewServer(dns.ServerConfig{Resolver: r, Local: local,
//		Addrs: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:15053")}})
//	if err := s.Listen(ctx); err != nil { ... }
//	go s.Serve()
//	defer s.Shutdown(ctx)
//
// Each loop screens what it reads (screen.go): a response (QR=1), a
// message shorter than a header or one from the listener's own address
// gets no reply, so one spoofed datagram cannot start a loop, and every
// reply, FORMERR and NOTIMP included, is made inside MaxInFlight. Each
// UDP query is answered on a goroutine of its own; a TCP connection is
// served on one, a query after the other. A server holds at most
// MaxTCPConns TCP connections, each first admitted by AdmitTCP, the
// proxy's admission control (tcpconns.go).
//
// A node-wide gozt serves about 110 pods, four sockets each. With
// ServerConfig.Sockets, a socket idle for ServerConfig.Idle is parked in
// the process's proxy/sockwait set and its loop ends; the set starts the
// loop again when the socket is readable, so an idle pod's DNS proxy holds
// no goroutine and no read buffer (issue 40).
//
// Name matching (match.go) is pure: the candidate names of a query (the
// name, its Kubernetes expansions, the name with each search domain
// stripped), each tried as is and then as wildcards, against the service
// hostnames visible to the client, ranked as ztunnel ranks them; and then,
// for a candidate <pod>.<service>.<ns>.svc.<domain>, against the workloads
// named <pod> that are endpoints of that headless service.
//
// proxy/dns imports state, proxy/sockopt, proxy/netns and proxy/sockwait;
// proxy imports it.
package dns
