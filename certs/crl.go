package certs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/big"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// CRLPollInterval is how often Watch looks at the CRL file. ztunnel reacts
// to file-system events debounced by 2s; gozt polls (no fsnotify) at the
// same cadence.
const CRLPollInterval = 2 * time.Second

// maxSignerCache bounds how many issuer certificates one CRL remembers the
// signature outcome for (see issuedCRL.signedBy).
const maxSignerCache = 16

// CRL is the set of certificate revocation lists read from one file
// (CRL_PATH, SPEC §2.1), consulted by ServerConfig and ClientConfig through
// the Cert that verifies (Cert.WithCRL, ManagerConfig.CRL).
//
// Invariants and ownership:
//   - the current set is an immutable snapshot swapped atomically; handshakes
//     read it without locking, and a reload that fails to read or parse
//     never replaces it (the previous good set stays in force).
//   - a CRL is authoritative for a certificate when its issuer name is the
//     certificate's issuer name and its signature verifies with that
//     issuer's key (the next certificate of the verified chain, or the
//     trust anchor). A CRL no issuer in a chain signed revokes nothing
//     there; unknown revocation status is allowed, in both directions, as in
//     ztunnel.
//   - NextUpdate is not enforced: an out-of-date CRL keeps revoking what it
//     lists (ztunnel: webpki ExpirationPolicy::Ignore).
//   - the poll state (stamp, sum, lastErr) is owned by the goroutine in
//     Watch; only one Watch may run at a time.
//
// A nil *CRL is valid and revokes nothing.
type CRL struct {
	path     string
	set      atomic.Pointer[crlSet]
	watching atomic.Bool // a Watch is running

	// Owned by Watch (and by LoadCRL before it returns).
	stamp   fileStamp         // the file's stat at the last read
	racy    bool              // the last read may have missed a same-size rewrite
	sum     [sha256.Size]byte // SHA-256 of the content last read
	sumErr  error             // that content's load error, or nil
	lastErr string            // the last error logged, to log each failure once
}

// fileStamp is what Watch compares before reading the file again.
type fileStamp struct {
	mod  time.Time
	size int64
}

// same reports whether s and o stamp the same file state.
func (s fileStamp) same(o fileStamp) bool { return s.size == o.size && s.mod.Equal(o.mod) }

// crlSet is one immutable load of the file.
type crlSet struct {
	byIssuer map[string][]*issuedCRL // by DER issuer name (x509 RawIssuer)
	lists    int                     // CRLs in the file
	entries  int                     // revoked serials, over all CRLs
	sum      [sha256.Size]byte       // SHA-256 of the file's content
}

// issuedCRL is one parsed CRL with its serials indexed.
type issuedCRL struct {
	rl      *x509.RevocationList // entries dropped once indexed
	serials map[string]struct{}  // serialKey of each revoked certificate

	mu      sync.Mutex
	signers map[string]bool // issuer cert DER → CRL signature verifies with it
}

// LoadCRL reads the CRL file at path: PEM with any number of "X509 CRL"
// blocks (other blocks are skipped), or one DER CRL. An empty file, or PEM
// with no CRL block, is an empty set (no revocations). A missing file is not
// an error either (as in ztunnel, where a ConfigMap may be mounted later):
// the set is empty until Watch sees the file. Any other read error, a
// malformed PEM block, a CRL that does not parse, a delta CRL, or a CRL
// with a critical extension gozt does not understand is an error naming
// path.
//
// CRL signatures cannot be checked here: a CRL's issuer is a root from a
// workload's CA response or an intermediate a peer presents, both learnt
// only at handshake time. They are checked there (see CRL).
func LoadCRL(path string) (*CRL, error) {
	l := &CRL{path: path}
	l.set.Store(&crlSet{})
	_, err := l.reload()
	if errors.Is(err, fs.ErrNotExist) {
		l.lastErr = err.Error()
		err = nil
	}
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Path returns the file l reads.
func (l *CRL) Path() string { return l.path }

// Counts returns how many CRLs the current set holds and how many serials
// they revoke in all.
func (l *CRL) Counts() (lists, entries int) {
	if l == nil {
		return 0, 0
	}
	s := l.set.Load()
	return s.lists, s.entries
}

// Watch polls the file every CRLPollInterval until ctx is done; only one
// Watch of l runs at a time (a second one logs and returns). When the
// content changes and loads, it publishes the new set (later handshakes use
// it) and then calls onChange (if not nil) on Watch's goroutine, so that the
// caller can tear down tunnels whose chain is now revoked (PeerRevoked).
// When the file is missing or does not load, Watch logs once per distinct
// failure and keeps the previous set. Watch returns after ctx is done.
func (l *CRL) Watch(ctx context.Context, log *slog.Logger, onChange func()) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if !l.watching.CompareAndSwap(false, true) {
		log.Error("crl: Watch already running; not watching twice", "path", l.path)
		return
	}
	defer l.watching.Store(false)
	if l.lastErr != "" {
		log.Warn("crl file not loaded yet; no revocations until it is", "path", l.path, "err", l.lastErr)
	}
	t := time.NewTicker(CRLPollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if l.poll(log) && onChange != nil {
			onChange()
		}
	}
}

// poll reloads the file if it changed, and reports whether a new set was
// published.
func (l *CRL) poll(log *slog.Logger) bool {
	changed, err := l.reload()
	switch {
	case err != nil && err.Error() != l.lastErr:
		l.lastErr = err.Error()
		log.Warn("crl reload failed; keeping the previous set", "path", l.path, "err", err)
	case err == nil && l.lastErr != "":
		l.lastErr = ""
		if !changed {
			log.Info("crl file readable again; set unchanged", "path", l.path)
		}
	}
	if changed {
		lists, entries := l.Counts()
		log.Info("crl reloaded", "path", l.path, "crls", lists, "revoked", entries)
	}
	return changed
}

// reload reads the file if its stamp changed (or the last read was racy)
// and, if its content is new, parses it and publishes the set. It reports
// whether the published content changed, and returns the current content's
// load error (again, while the content stays the same).
func (l *CRL) reload() (bool, error) {
	fi, err := os.Stat(l.path)
	if err != nil {
		return false, l.wrapErr(err)
	}
	st := fileStamp{fi.ModTime(), fi.Size()}
	if st.same(l.stamp) && !l.racy {
		return false, l.sumErr
	}
	data, err := os.ReadFile(l.path)
	if err != nil {
		return false, l.wrapErr(err)
	}
	// File times are coarse (a kernel tick): a same-size rewrite in the
	// same tick as this read would keep the stamp, so while the file is
	// that fresh, read it again next time (git's "racily clean" rule).
	l.stamp, l.racy = st, time.Since(st.mod) < time.Second
	sum := sha256.Sum256(data)
	if sum == l.sum {
		return false, l.sumErr
	}
	l.sum = sum
	set, err := parseCRLSet(data)
	if err != nil {
		l.sumErr = l.wrapErr(err)
		return false, l.sumErr
	}
	l.sumErr = nil
	set.sum = sum
	changed := sum != l.set.Load().sum
	l.set.Store(set)
	return changed, nil
}

// wrapErr names the file in a load error (one line).
func (l *CRL) wrapErr(err error) error {
	return fmt.Errorf("certs: CRL_PATH %q: %w", l.path, err)
}

// parseCRLSet parses the file's content (see LoadCRL) and indexes it.
func parseCRLSet(data []byte) (*crlSet, error) {
	ders, err := crlDERs(data)
	if err != nil {
		return nil, err
	}
	s := &crlSet{byIssuer: make(map[string][]*issuedCRL, len(ders))}
	for i, der := range ders {
		ic, err := parseCRL(der)
		if err != nil {
			return nil, fmt.Errorf("crl %d: %w", i+1, err)
		}
		key := string(ic.rl.RawIssuer)
		s.byIssuer[key] = append(s.byIssuer[key], ic)
		s.lists++
		s.entries += len(ic.serials)
	}
	return s, nil
}

// crlDERs splits the file into DER CRLs: every "X509 CRL" block if it is
// PEM (its first non-space bytes are "-----BEGIN"), else the whole file.
// ztunnel reads PEM only when the file starts with "-----BEGIN"; gozt also
// accepts leading white space there.
func crlDERs(data []byte) ([][]byte, error) {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) == 0 {
		return nil, nil
	}
	if !bytes.HasPrefix(trimmed, []byte("-----BEGIN")) {
		return [][]byte{data}, nil
	}
	var ders [][]byte
	blocks := 0
	for rest := trimmed; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		blocks++
		if b.Type == "X509 CRL" {
			ders = append(ders, b.Bytes)
		}
	}
	// pem.Decode skips a block it cannot decode; refuse the file instead.
	if begins := bytes.Count(trimmed, []byte("-----BEGIN ")); blocks != begins {
		return nil, fmt.Errorf("malformed PEM: %d of %d blocks decode", blocks, begins)
	}
	return ders, nil
}

// CRL and CRL entry extensions (RFC 5280 §5.2, §5.3).
var (
	oidCRLNumber        = asn1.ObjectIdentifier{2, 5, 29, 20}
	oidAuthorityKeyID   = asn1.ObjectIdentifier{2, 5, 29, 35}
	oidIssuerAltName    = asn1.ObjectIdentifier{2, 5, 29, 18}
	oidIssuingDistPoint = asn1.ObjectIdentifier{2, 5, 29, 28}
	oidDeltaCRLIndic    = asn1.ObjectIdentifier{2, 5, 29, 27}
	oidFreshestCRL      = asn1.ObjectIdentifier{2, 5, 29, 46}
	oidReasonCode       = asn1.ObjectIdentifier{2, 5, 29, 21}
	oidInvalidityDate   = asn1.ObjectIdentifier{2, 5, 29, 24}
	oidHoldInstruction  = asn1.ObjectIdentifier{2, 5, 29, 23}
)

// parseCRL parses one DER CRL and indexes its serials. Like webpki it
// refuses delta CRLs; and, as RFC 5280 §5.2 requires, a CRL or entry with
// a critical extension it does not know (which also refuses indirect CRLs,
// whose certificateIssuer entry extension is critical).
func parseCRL(der []byte) (*issuedCRL, error) {
	rl, err := x509.ParseRevocationList(der)
	if err != nil {
		return nil, err
	}
	for _, ext := range rl.Extensions {
		if ext.Id.Equal(oidDeltaCRLIndic) {
			return nil, errors.New("delta CRLs are not supported")
		}
		if ext.Critical && !knownOID(ext.Id, oidCRLNumber, oidAuthorityKeyID, oidIssuerAltName, oidIssuingDistPoint, oidFreshestCRL) {
			return nil, fmt.Errorf("unsupported critical CRL extension %v", ext.Id)
		}
	}
	ic := &issuedCRL{rl: rl, serials: make(map[string]struct{}, len(rl.RevokedCertificateEntries))}
	for _, e := range rl.RevokedCertificateEntries {
		for _, ext := range e.Extensions {
			if ext.Critical && !knownOID(ext.Id, oidReasonCode, oidInvalidityDate, oidHoldInstruction) {
				return nil, fmt.Errorf("serial %x: unsupported critical entry extension %v", e.SerialNumber, ext.Id)
			}
		}
		ic.serials[serialKey(e.SerialNumber)] = struct{}{}
	}
	rl.RevokedCertificateEntries = nil // indexed; keep only what signature checks need
	return ic, nil
}

// knownOID reports whether id is one of known.
func knownOID(id asn1.ObjectIdentifier, known ...asn1.ObjectIdentifier) bool {
	for _, k := range known {
		if id.Equal(k) {
			return true
		}
	}
	return false
}

// serialKey is a certificate serial as a map key.
func serialKey(n *big.Int) string {
	if n == nil {
		return ""
	}
	return n.Text(16)
}

// signedBy reports whether issuer signed ic: its key verifies ic's
// signature and it may sign CRLs (x509.RevocationList.CheckSignatureFrom:
// a CA, with cRLSign if it has a key usage). Outcomes are cached per
// issuer certificate, up to maxSignerCache of them.
func (ic *issuedCRL) signedBy(issuer *x509.Certificate) bool {
	ic.mu.Lock()
	ok, seen := ic.signers[string(issuer.Raw)]
	ic.mu.Unlock()
	if seen {
		return ok
	}
	ok = ic.rl.CheckSignatureFrom(issuer) == nil
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if len(ic.signers) < maxSignerCache {
		if ic.signers == nil {
			ic.signers = make(map[string]bool)
		}
		ic.signers[string(issuer.Raw)] = ok
	}
	return ok
}

// listed returns the CRL of s that issuer signed and that lists cert, or
// nil.
func (s *crlSet) listed(cert, issuer *x509.Certificate) *issuedCRL {
	for _, ic := range s.byIssuer[string(cert.RawIssuer)] {
		if _, ok := ic.serials[serialKey(cert.SerialNumber)]; ok && ic.signedBy(issuer) {
			return ic
		}
	}
	return nil
}

// mayList reports whether some CRL of s with a certificate's issuer name
// lists its serial, for a certificate of peer. Only peer's certificates
// (never a trust anchor) are checked on a path built from them, so if it
// reports false, no path is revoked.
func (s *crlSet) mayList(peer []*x509.Certificate) bool {
	for _, cert := range peer {
		for _, ic := range s.byIssuer[string(cert.RawIssuer)] {
			if _, ok := ic.serials[serialKey(cert.SerialNumber)]; ok {
				return true
			}
		}
	}
	return false
}

// revokedIn returns the first certificate of chain (leaf first, each
// certificate issued by the next, ending in a trust anchor) that a CRL of
// its issuer lists, or nil. The trust anchor itself is not checked
// (webpki RevocationCheckDepth::Chain: leaf and intermediates).
func (s *crlSet) revokedIn(chain []*x509.Certificate) *x509.Certificate {
	if len(s.byIssuer) == 0 {
		return nil
	}
	for i := 0; i+1 < len(chain); i++ {
		if s.listed(chain[i], chain[i+1]) != nil {
			return chain[i]
		}
	}
	return nil
}

// Revoked reports whether chain, a verified chain (leaf first, each
// certificate issued by the next, ending in a trust anchor, as
// x509.Certificate.Verify returns), has a leaf or intermediate that a CRL
// of its issuer lists in the current set. A nil l reports false.
func (l *CRL) Revoked(chain []*x509.Certificate) bool {
	return l != nil && l.set.Load().revokedIn(chain) != nil
}

// PeerRevoked reports whether the peer of a TLS handshake that c verified
// is revoked under the current set: peer is the chain the peer presented
// (tls.ConnectionState.PeerCertificates) and at the time of the handshake.
// It rebuilds the paths from the leaf to c's roots as at, and reports true
// when every path has a revoked certificate (the handshake rule); false
// when some path has none, or when no path verifies (the handshake would
// have failed otherwise, which is not a revocation). A nil l reports false.
//
// For an existing tunnel, record (c, peer, handshake time) once the
// handshake succeeds, make the tunnel visible to the OnChange handler
// first and then call PeerRevoked once: a reload that raced the handshake
// is then seen either by that call or by the handler.
func (l *CRL) PeerRevoked(c *Cert, peer []*x509.Certificate, at time.Time) bool {
	if l == nil || c == nil || len(peer) == 0 || len(peer) > maxPeerChainLen {
		return false
	}
	s := l.set.Load()
	if !s.mayList(peer) {
		return false // the common case on a reload sweep: no path building
	}
	chains, err := peer[0].Verify(x509.VerifyOptions{
		Roots:         c.RootPool(),
		Intermediates: intermediatePool(peer[1:]),
		CurrentTime:   at,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return false
	}
	_, err = s.unrevoked(chains)
	return err != nil
}

// unrevoked returns the chains of chains (verified chains) in which no
// certificate is revoked, or an ErrCertRevoked error naming a revoked
// certificate if every chain has one. Peers pass when any path is clean,
// as with webpki's path building. A nil l returns chains.
func (l *CRL) unrevoked(chains [][]*x509.Certificate) ([][]*x509.Certificate, error) {
	if l == nil {
		return chains, nil
	}
	return l.set.Load().unrevoked(chains)
}

func (s *crlSet) unrevoked(chains [][]*x509.Certificate) ([][]*x509.Certificate, error) {
	if len(s.byIssuer) == 0 {
		return chains, nil
	}
	var ok [][]*x509.Certificate
	var first *x509.Certificate
	for _, chain := range chains {
		switch r := s.revokedIn(chain); {
		case r == nil:
			ok = append(ok, chain)
		case first == nil:
			first = r
		}
	}
	if len(ok) == 0 && first != nil {
		return nil, fmt.Errorf("%w: serial %x issued by %q", ErrCertRevoked, first.SerialNumber, first.Issuer.String())
	}
	return ok, nil
}
