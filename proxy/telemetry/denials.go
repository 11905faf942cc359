package telemetry

import (
	"net/netip"
	"sync"
	"time"

	"github.com/gozt/gozt/rbac"
	"github.com/gozt/gozt/state"
)

// Denial is one connection that authorization refused, for the admin live
// view: who asked for what, and the policy and rule that decided. It holds
// addresses and identities only, nothing secret.
type Denial struct {
	Time time.Time `json:"time"`
	// Workload is the local workload the connection was for, as
	// namespace/name, and WorkloadUID its uid.
	Workload    string `json:"workload"`
	WorkloadUID string `json:"workloadUid"`
	// Via is how the connection arrived: HBONE (15008), TCP (plaintext
	// 15006), or "policy change" for a live connection closed because a
	// policy update denied it (SPEC §4.4).
	Via         string         `json:"via"`
	Src         netip.AddrPort `json:"src"`
	SrcIdentity string         `json:"srcIdentity,omitempty"` // the peer's SPIFFE id; empty without mTLS
	Dst         netip.AddrPort `json:"dst"`
	// Policy is the deciding policy (namespace/name), or "" when none did
	// (no ALLOW policy matched, or a referenced policy is unknown).
	Policy string `json:"policy,omitempty"`
	// Rule is the index of the deciding rule in Policy, or -1.
	Rule int `json:"rule"`
	// Reason is the decision as the access log words it.
	Reason string `json:"reason"`
}

// Via values of Denial.
const (
	ViaHBONE        = "HBONE"
	ViaTCP          = "TCP"
	ViaPolicyChange = "policy change"
)

// DefaultDenials is how many denials NewDenials keeps when asked for none.
const DefaultDenials = 64

// Denials keeps the most recent denials of the proxies that share it, in a
// ring of fixed size: memory stays bounded however many connections are
// refused, and recording costs a short lock and a copy, only on a denial.
// The zero value is not usable; a nil *Denials records nothing.
type Denials struct {
	mu    sync.Mutex
	ring  []Denial // fixed length; the oldest is overwritten
	next  int      // index of the slot the next denial takes
	total uint64   // denials recorded since start
}

// NewDenials returns a ring of the last n denials; if n ≤ 0,
// DefaultDenials.
func NewDenials(n int) *Denials {
	if n <= 0 {
		n = DefaultDenials
	}
	return &Denials{ring: make([]Denial, n)}
}

// Record adds d, dropping the oldest denial once the ring is full.
func (ds *Denials) Record(d Denial) {
	if ds == nil {
		return
	}
	ds.mu.Lock()
	ds.ring[ds.next] = d
	ds.next = (ds.next + 1) % len(ds.ring)
	ds.total++
	ds.mu.Unlock()
}

// Recent returns a copy of the kept denials, newest first, and how many
// were recorded in all (more than len(recent) once the ring wrapped).
func (ds *Denials) Recent() (recent []Denial, total uint64) {
	if ds == nil {
		return []Denial{}, 0
	}
	ds.mu.Lock()
	defer ds.mu.Unlock()
	n := int(min(ds.total, uint64(len(ds.ring))))
	recent = make([]Denial, 0, n)
	for i := 1; i <= n; i++ {
		recent = append(recent, ds.ring[(ds.next-i+len(ds.ring))%len(ds.ring)])
	}
	return recent, ds.total
}

// NewDenial is the denial, now, of c to the local workload, arrived via
// via, by decision d.
func NewDenial(local *state.Workload, via string, c rbac.Conn, d rbac.Decision) Denial {
	out := Denial{
		Time: time.Now(), Workload: local.Namespace + "/" + local.Name, WorkloadUID: local.UID, Via: via,
		Src: c.Src, SrcIdentity: Principal(c.Identity), Dst: c.Dst, Rule: -1, Reason: d.String(),
	}
	if d.Policy != nil {
		out.Policy, out.Rule = d.Policy.Key(), d.Rule
	}
	return out
}
