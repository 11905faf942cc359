package proxy

import "github.com/gozt/gozt/proxy/telemetry"

// Connections returns the proxy's open connections, inbound and outbound
// (nil unless Config.ListConnections).
func (p *Proxy) Connections() (inbound, outbound []telemetry.ConnJSON) {
	return p.live.Conns()
}

// LiveConnections appends to dst at most max of the proxy's open
// connections, with their byte counts now, and returns it with how many are
// open in all (empty unless Config.ListConnections).
func (p *Proxy) LiveConnections(dst []telemetry.LiveConn, max int) ([]telemetry.LiveConn, int) {
	return p.live.Live(dst, max)
}
