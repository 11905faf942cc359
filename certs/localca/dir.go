package localca

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// File names of Istio's plug-in CA layout ("cacerts" secret).
const (
	fileCACert    = "ca-cert.pem"    // the certificate that signs leaves
	fileCAKey     = "ca-key.pem"     // its private key
	fileRootCert  = "root-cert.pem"  // trust anchors
	fileCertChain = "cert-chain.pem" // ca-cert and the intermediates above it (maybe the root too)
)

// loadOrCreate loads the CA in cfg.Dir, or creates a root there if none of
// the CA files exist. A partial layout is an error, never overwritten.
func loadOrCreate(cfg Config) (*CA, error) {
	names := []string{fileCACert, fileCAKey, fileRootCert, fileCertChain}
	present := 0
	for _, n := range names {
		switch _, err := os.Stat(filepath.Join(cfg.Dir, n)); {
		case err == nil:
			present++
		case !errors.Is(err, fs.ErrNotExist):
			return nil, err
		}
	}
	if present == 0 {
		return create(cfg)
	}
	return load(cfg)
}

// create makes a new root and writes it to cfg.Dir.
func create(cfg Config) (*CA, error) {
	ca, err := newRoot(cfg)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return nil, fmt.Errorf("marshal key: %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	rootPEM := ca.RootPEM()
	files := []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		// The key goes first: if a later write fails, load() reports the
		// partial layout instead of silently serving a different root.
		{fileCAKey, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600},
		{fileCACert, rootPEM, 0o644},
		{fileRootCert, rootPEM, 0o644},
		{fileCertChain, rootPEM, 0o644},
	}
	for _, f := range files {
		if err := writeFileAtomic(filepath.Join(cfg.Dir, f.name), f.data, f.mode); err != nil {
			return nil, err
		}
	}
	return ca, nil
}

// writeFileAtomic writes data to a temporary file in the same directory
// and renames it over name, so readers never see a partial file.
func writeFileAtomic(name string, data []byte, mode os.FileMode) (err error) {
	f, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), name)
}

// load reads the CA from cfg.Dir. ca-cert.pem and ca-key.pem are
// required. Roots come from root-cert.pem (or, if absent, ca-cert.pem
// must be self-signed). The chain served after each leaf is ca-cert.pem
// (unless it is a root) followed by cert-chain.pem's certificates that are
// neither ca-cert nor a root.
func load(cfg Config) (*CA, error) {
	signers, err := readCerts(filepath.Join(cfg.Dir, fileCACert))
	if err != nil {
		return nil, err
	}
	signer := signers[0]
	key, err := readKey(filepath.Join(cfg.Dir, fileCAKey))
	if err != nil {
		return nil, err
	}
	if !publicKeyEqual(key.Public(), signer.PublicKey) {
		return nil, fmt.Errorf("%s does not match %s", fileCAKey, fileCACert)
	}
	if !signer.IsCA || signer.KeyUsage != 0 && signer.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("%s is not a CA certificate", fileCACert)
	}
	roots, err := readCerts(filepath.Join(cfg.Dir, fileRootCert))
	switch {
	case errors.Is(err, fs.ErrNotExist) && isSelfSigned(signer):
		roots = []*x509.Certificate{signer}
	case err != nil:
		return nil, err
	}
	chain, err := readCerts(filepath.Join(cfg.Dir, fileCertChain))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	ca := &CA{cfg: cfg, signer: signer, key: key, roots: roots}
	ca.intermediates = servedChain(signer, chain, roots)
	if err := ca.verifySigner(); err != nil {
		return nil, err
	}
	return ca, nil
}

// servedChain returns the intermediates served after a leaf: signer, then
// chain, minus roots and duplicates.
func servedChain(signer *x509.Certificate, chain, roots []*x509.Certificate) []*x509.Certificate {
	var out []*x509.Certificate
	seen := func(c *x509.Certificate) bool {
		for _, o := range append(out[:len(out):len(out)], roots...) {
			if bytes.Equal(o.Raw, c.Raw) {
				return true
			}
		}
		return false
	}
	for _, c := range append([]*x509.Certificate{signer}, chain...) {
		if !seen(c) {
			out = append(out, c)
		}
	}
	return out
}

// verifySigner checks that the signing certificate chains to the roots
// through the served intermediates, so issued leaves will verify.
func (ca *CA) verifySigner() error {
	roots := x509.NewCertPool()
	for _, r := range ca.roots {
		roots.AddCert(r)
	}
	inter := x509.NewCertPool()
	for _, c := range ca.intermediates {
		inter.AddCert(c)
	}
	_, err := ca.signer.Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inter,
		CurrentTime:   ca.cfg.now(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return fmt.Errorf("%s does not chain to %s: %w", fileCACert, fileRootCert, err)
	}
	return nil
}

// isSelfSigned reports whether c is signed by its own key.
func isSelfSigned(c *x509.Certificate) bool {
	return bytes.Equal(c.RawIssuer, c.RawSubject) && c.CheckSignatureFrom(c) == nil
}

// readCerts reads every CERTIFICATE block of a PEM file; it is an error if
// there is none.
func readCerts(name string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no certificates", name)
	}
	return out, nil
}

// readKey reads a PKCS#8, SEC 1 (EC) or PKCS#1 (RSA) private key.
func readKey(name string) (crypto.Signer, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	b, _ := pem.Decode(data)
	if b == nil {
		return nil, fmt.Errorf("%s: no PEM block", name)
	}
	var key any
	switch b.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(b.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(b.Bytes)
	default:
		return nil, fmt.Errorf("%s: unsupported PEM type %q", name, b.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	switch k := key.(type) {
	case *ecdsa.PrivateKey, *rsa.PrivateKey, ed25519.PrivateKey:
		return k.(crypto.Signer), nil
	}
	return nil, fmt.Errorf("%s: unsupported key type %T", name, key)
}

// publicKeyEqual reports whether a and b are the same public key.
func publicKeyEqual(a, b crypto.PublicKey) bool {
	k, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && k.Equal(b)
}
