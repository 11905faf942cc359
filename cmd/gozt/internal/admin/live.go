package admin

import (
	_ "embed"
	"encoding/json"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/gozt/gozt/certs"
	"github.com/gozt/gozt/certs/identity"
	"github.com/gozt/gozt/proxy"
	"github.com/gozt/gozt/proxy/telemetry"
	"github.com/gozt/gozt/state"
)

// The live view is gozt's addition to ztunnel's admin port: / serves one
// page (live.html, embedded, no external assets) that polls GET /debug/live
// every second and shows the node at a glance. /debug/live is JSON:
//
//	{
//	  "time": RFC 3339 with milliseconds, when the snapshot was taken,
//	  "mode": "local" | "dedicated" | "shared",
//	  "workloads": [{"uid", "name", "namespace", "identity" (SPIFFE id),
//	      "addresses": [IP], "state" ("Up"/"Pending", shared mode only),
//	      "certificate": {"state", "serialNumber", "validFrom",
//	          "expirationTime"} or null}],
//	  "connections": {"listed": whether the proxies keep the list (every
//	      mode does), "total": open connections, "shown": [{"direction"
//	      (inbound/outbound), "protocol", "src", "originalDst", "actualDst",
//	      "srcWorkload", "srcIdentity", "dstWorkload", "dstIdentity",
//	      "start", "requestBytes", "responseBytes", "bytesLive"}]},
//	  "denials": {"total": denials since start, "recent": [{"time",
//	      "workload", "workloadUid", "via", "src", "srcIdentity", "dst",
//	      "policy", "rule", "reason"}] newest first},
//	  "controlPlane": {"xds", "ca", "zds" (shared mode only): {"state"
//	      (connected/disconnected/connecting/static/built-in), "address",
//	      "since", "lastError"}}
//	}
//
// Connections are capped at LiveConnLimit (total says how many are open)
// and denials at the proxies' ring. Certificates appear as /config_dump
// shows them, without PEM: no private key or token is ever part of it.

//go:embed live.html
var livePage []byte

// LiveConnLimit is the most connections /debug/live lists.
const LiveConnLimit = 200

// LiveInput is what the live view shows; Config.Live returns it.
type LiveInput struct {
	// Mode is "local", "dedicated" or "shared".
	Mode string
	// Workloads are the workloads this node serves.
	Workloads []LiveWorkload
	// Certs are the certificate manager's states; each workload shows its
	// identity's.
	Certs []certs.State
	// ConnsListed reports whether the proxies keep the list of their
	// connections (Conns is empty otherwise).
	ConnsListed bool
	// Conns are at most LiveConnLimit open connections, of ConnsTotal.
	Conns      []telemetry.LiveConn
	ConnsTotal int
	// Denials are the recent denials, newest first, of DenialsTotal.
	Denials      []telemetry.Denial
	DenialsTotal uint64
	// XDS, CA and ZDS are the control-plane connections; nil ones are
	// left out (ZDS outside shared mode).
	XDS, CA, ZDS *Link
}

// LiveWorkload is one workload the node serves.
type LiveWorkload struct {
	UID, Name, Namespace string
	Identity             identity.Identity
	Addresses            []netip.Addr
	// State is shared mode's pod state ("Up", "Pending"), or "".
	State string
}

// AddWorkload adds w, if non-nil, to the workloads shown, with its pod
// state (shared mode) or "".
func (in *LiveInput) AddWorkload(w *state.Workload, podState string) {
	if w == nil {
		return
	}
	in.Workloads = append(in.Workloads, LiveWorkload{
		UID: w.UID, Name: w.Name, Namespace: w.Namespace, Identity: w.Identity(),
		Addresses: w.Addresses, State: podState,
	})
}

// AddConns adds the open connections of p, as many as fit under
// LiveConnLimit, and counts them all.
func (in *LiveInput) AddConns(p *proxy.Proxy) {
	var n int
	in.Conns, n = p.LiveConnections(in.Conns, LiveConnLimit-len(in.Conns))
	in.ConnsTotal += n
}

// SetDenials shows the recent denials of ds (nil: none).
func (in *LiveInput) SetDenials(ds *telemetry.Denials) {
	in.Denials, in.DenialsTotal = ds.Recent()
}

// Link states of the live view's control plane.
const (
	LinkConnected    = "connected"
	LinkDisconnected = "disconnected"
	LinkConnecting   = "connecting" // no attempt has ended yet
	LinkStatic       = "static"     // no server: the local config file
	LinkBuiltIn      = "built-in"   // no server: the built-in CA
)

// Link is the state of one control-plane connection.
type Link struct {
	State     string // one of the Link* states
	Address   string // the server, or ""
	Since     time.Time
	LastError string
}

// NewLink returns the Link of a connection to address from its status:
// connecting while since is zero, else connected or disconnected.
func NewLink(address string, connected bool, since time.Time, lastError string) *Link {
	l := &Link{Address: address, Since: since, LastError: lastError, State: LinkDisconnected}
	switch {
	case since.IsZero():
		l.State = LinkConnecting
	case connected:
		l.State = LinkConnected
	}
	return l
}

type liveJSON struct {
	Time         string              `json:"time"`
	Mode         string              `json:"mode"`
	Workloads    []liveWorkloadJSON  `json:"workloads"`
	Connections  liveConnsJSON       `json:"connections"`
	Denials      liveDenialsJSON     `json:"denials"`
	ControlPlane map[string]linkJSON `json:"controlPlane"`
}

type liveWorkloadJSON struct {
	UID         string        `json:"uid"`
	Name        string        `json:"name"`
	Namespace   string        `json:"namespace"`
	Identity    string        `json:"identity"`
	Addresses   []string      `json:"addresses"`
	State       string        `json:"state,omitempty"`
	Certificate *liveCertJSON `json:"certificate"`
}

type liveCertJSON struct {
	State          string `json:"state"`
	SerialNumber   string `json:"serialNumber,omitempty"`
	ValidFrom      string `json:"validFrom,omitempty"`
	ExpirationTime string `json:"expirationTime,omitempty"`
}

type liveConnsJSON struct {
	Listed bool                 `json:"listed"`
	Total  int                  `json:"total"`
	Shown  []telemetry.LiveConn `json:"shown"`
}

type liveDenialsJSON struct {
	Total  uint64             `json:"total"`
	Recent []telemetry.Denial `json:"recent"`
}

type linkJSON struct {
	State     string `json:"state"`
	Address   string `json:"address,omitempty"`
	Since     string `json:"since,omitempty"`
	LastError string `json:"lastError,omitempty"`
}

// liveView renders in as /debug/live at now.
func liveView(in LiveInput, now time.Time) liveJSON {
	out := liveJSON{
		Time:         now.UTC().Format(time.RFC3339Nano),
		Mode:         in.Mode,
		Workloads:    make([]liveWorkloadJSON, 0, len(in.Workloads)),
		Connections:  liveConnsJSON{Listed: in.ConnsListed, Total: max(in.ConnsTotal, len(in.Conns)), Shown: liveConns(in.Conns)},
		Denials:      liveDenialsJSON{Total: max(in.DenialsTotal, uint64(len(in.Denials))), Recent: in.Denials},
		ControlPlane: map[string]linkJSON{},
	}
	if out.Denials.Recent == nil {
		out.Denials.Recent = []telemetry.Denial{}
	}
	byID := make(map[identity.Identity]*certs.State, len(in.Certs))
	for i := range in.Certs {
		byID[in.Certs[i].Identity] = &in.Certs[i]
	}
	for _, w := range in.Workloads {
		out.Workloads = append(out.Workloads, liveWorkload(w, byID[w.Identity]))
	}
	slices.SortFunc(out.Workloads, func(a, b liveWorkloadJSON) int {
		return strings.Compare(a.Namespace+"/"+a.Name+"/"+a.UID, b.Namespace+"/"+b.Name+"/"+b.UID)
	})
	for name, l := range map[string]*Link{"xds": in.XDS, "ca": in.CA, "zds": in.ZDS} {
		if l != nil {
			out.ControlPlane[name] = link(l)
		}
	}
	return out
}

// liveConns sorts and caps the connections shown: oldest first, then by
// source.
func liveConns(conns []telemetry.LiveConn) []telemetry.LiveConn {
	shown := slices.Clone(conns)
	if shown == nil {
		shown = []telemetry.LiveConn{}
	}
	slices.SortFunc(shown, func(a, b telemetry.LiveConn) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		return strings.Compare(a.Src, b.Src)
	})
	return shown[:min(len(shown), LiveConnLimit)]
}

func liveWorkload(w LiveWorkload, st *certs.State) liveWorkloadJSON {
	out := liveWorkloadJSON{
		UID: w.UID, Name: w.Name, Namespace: w.Namespace, Identity: w.Identity.String(),
		Addresses: make([]string, 0, len(w.Addresses)), State: w.State,
	}
	for _, a := range w.Addresses {
		out.Addresses = append(out.Addresses, a.String())
	}
	if st != nil {
		// The leaf only: its serial and validity, never PEM or a key.
		c := &liveCertJSON{State: st.Status}
		if st.Cert != nil {
			if chain := st.Cert.Chain(); len(chain) > 0 {
				leaf := certItem(chain[0])
				c.SerialNumber, c.ValidFrom, c.ExpirationTime = leaf.SerialNumber, leaf.ValidFrom, leaf.ExpirationTime
			}
		}
		out.Certificate = c
	}
	return out
}

func link(l *Link) linkJSON {
	out := linkJSON{State: l.State, Address: l.Address, LastError: l.LastError}
	if !l.Since.IsZero() {
		out.Since = l.Since.UTC().Format(time.RFC3339)
	}
	return out
}

// serveLivePage serves the live view's page at / (other paths 404).
func serveLivePage(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/" {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:")
	_, _ = w.Write(livePage)
}

// liveHandler serves /debug/live from live; without one the view has no
// data (404), and the page says so.
func liveHandler(live func() LiveInput) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if live == nil {
			http.Error(w, "no live view in this mode", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(liveView(live(), time.Now()))
	}
}
