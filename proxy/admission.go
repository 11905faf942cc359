package proxy

import (
	"net"

	"github.com/gozt/gozt/proxy/admission"
	"github.com/gozt/gozt/proxy/telemetry"
)

// This file is the proxy's side of admission control (package admission):
// what it counts, logs and resets when the process's Controller refuses.

// admit reports whether a connection accepted on listener may be served;
// if not it counts and logs it, then resets c (the client must not wait on
// us; counted first, so that whoever sees the reset finds it counted).
func (p *Proxy) admit(c net.Conn, listener string) bool {
	if !p.cfg.Admission.MemoryPressure() {
		return true
	}
	p.shedForMemory(listener)
	p.abortLeg(c)
	return false
}

// shedForMemory counts and logs one connection or stream on listener
// refused for memory pressure.
func (p *Proxy) shedForMemory(listener string) {
	p.cfg.Metrics.Shed(listener, telemetry.ShedMemoryPressure).Inc()
	p.cfg.Admission.NoteMemoryShed()
}

// admitting wraps listener name's l in admission control: a failed accept
// backs off or, out of descriptors, sheds the queue with the spare
// descriptor (acceptFailed), a successful one takes the spare back, and a
// connection accepted under memory pressure is reset (admit), each counted
// under name.
func (p *Proxy) admitting(l net.Listener, name string) *admission.Listener {
	a := &admitted{Listener: admission.Listener{Listener: l}, p: p, name: name}
	a.Hooks = a
	return &a.Listener
}

// admitted is a listener under p's admission control with its hooks, in
// one allocation (the Listener and three closures were four, about 1 KB
// per pod on a node: bench/NOTES.md).
type admitted struct {
	admission.Listener
	p    *Proxy
	name string
}

func (a *admitted) Failed(err error, failures int) {
	a.p.acceptFailed(a.Listener.Listener, a.name, err, failures)
}

func (a *admitted) Accepted() { a.p.accept.accepted() }

func (a *admitted) Admit(c net.Conn) bool { return a.p.admit(c, a.name) }

// admitDNS wraps a DNS proxy's TCP listener in admission control.
func (p *Proxy) admitDNS(l net.Listener) *admission.Listener {
	return p.admitting(l, telemetry.DNSListener)
}
