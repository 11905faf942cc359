package node

import (
	"bytes"
	"context"
	"os"
	"time"

	"github.com/gozt/gozt/certs/istioca"
)

// rootPollInterval is how often gozt reads CA_ROOT_CA's file for a change,
// as often as CRL_PATH's (certs.CRLPollInterval).
const rootPollInterval = 2 * time.Second

// rootFile is CA_ROOT_CA's path when it names a file (SPEC §0.3: a path
// that exists), else "" (SYSTEM, or inline PEM).
func rootFile(setting string) string {
	if setting == "SYSTEM" {
		return ""
	}
	if _, err := os.Stat(setting); err != nil {
		return ""
	}
	return setting
}

// watchRoots reads CA_ROOT_CA's file every rootPollInterval and, when it
// holds other certificates than before, tells the certificate manager
// (certs.Manager.RootsChanged), which fetches every certificate again at
// once and so learns the CA's new root without waiting for half-life. In
// Istio the file is the istio-ca-root-cert ConfigMap, which istiod
// rewrites when its root changes. The file's certificates are only a
// signal: peers are trusted on the CA's answers alone. A file that cannot
// be read or holds no certificate is skipped until it does.
func (n *Node) watchRoots(ctx context.Context) error {
	path := rootFile(n.opts.Env.CARootCA)
	last, _ := os.ReadFile(path)
	t := time.NewTicker(rootPollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		data, err := os.ReadFile(path)
		if err != nil || bytes.Equal(data, last) {
			continue
		}
		if _, err := istioca.RootPool(data); err != nil {
			continue // mid-rewrite, or broken: the next good content counts
		}
		last = data
		n.log.Info("CA root file changed", "scope", "certs", "path", path)
		n.certs.RootsChanged()
	}
}
