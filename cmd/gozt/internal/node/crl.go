package node

import (
	"context"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/proxy"
)

// loadCRL reads CRL_PATH, if set (SPEC §2.1). A list that does not load
// leaves the node running without revocation checks, with a warning, as
// ztunnel does: one bad ConfigMap must not crash-loop every node. A missing
// file is an empty list until it appears (certs.LoadCRL).
func (n *Node) loadCRL() *certs.CRL {
	path := n.opts.Env.CRLPath
	if path == "" {
		return nil
	}
	crl, err := certs.LoadCRL(path)
	if err != nil {
		n.log.Warn("running without certificate revocation checks", "scope", "crl", "error", err)
		return nil
	}
	lists, entries := crl.Counts()
	n.log.Info("certificate revocation lists loaded", "scope", "crl", "path", path, "lists", lists, "revoked", entries)
	return crl
}

// watchCRL reloads CRL_PATH as it changes and closes, in every workload
// proxy, the tunnels whose peer the new lists revoke.
func (n *Node) watchCRL(ctx context.Context) error {
	n.crl.Watch(ctx, n.log.With("scope", "crl"), func() {
		closed := 0
		n.eachProxy(func(p *proxy.Proxy) { closed += p.CRLChanged() })
		lists, entries := n.crl.Counts()
		n.log.Info("certificate revocation lists reloaded", "scope", "crl", "lists", lists, "revoked", entries, "closed", closed)
	})
	return nil
}

// eachProxy calls f with every running workload proxy.
func (n *Node) eachProxy(f func(*proxy.Proxy)) {
	if n.proxy != nil {
		f(n.proxy)
	}
	if p := n.self.Load(); p != nil {
		f(p)
	}
	if n.pods != nil {
		n.pods.mu.Lock()
		running := make([]*proxy.Proxy, 0, len(n.pods.running))
		for _, pp := range n.pods.running {
			running = append(running, pp.p)
		}
		n.pods.mu.Unlock()
		for _, p := range running {
			f(p)
		}
	}
}
