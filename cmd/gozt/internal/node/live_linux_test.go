package node

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// liveSharedJSON is the part of shared mode's /debug/live this test reads.
type liveSharedJSON struct {
	Mode      string `json:"mode"`
	Workloads []struct {
		UID, Name, Identity, State string
	} `json:"workloads"`
	Connections struct {
		Listed bool `json:"listed"`
		Total  int  `json:"total"`
		Shown  []struct {
			Direction, Src, OriginalDst, SrcIdentity string
			RequestBytes, ResponseBytes              int64
			BytesLive                                bool
		} `json:"shown"`
	} `json:"connections"`
	ControlPlane map[string]struct{ State, Address string } `json:"controlPlane"`
}

// TestLiveViewShared: in shared mode /debug/live shows each pod istio-cni
// handed over, Up, with its identity; the ZDS link connected to istio-cni's
// socket; and a connection open from one pod to another with the bytes it
// has moved, while it is open.
func TestLiveViewShared(t *testing.T) {
	m := newMeshNet(t)
	m.node(1)
	a, c := m.pod(1, 2, true), m.pod(1, 3, true)
	startApp(t, c, 8080)
	cp := newControlPlane(t)
	n := cp.startShared(t, "node1")
	cp.xds.PushWorkload(meshWorkload("a", a.ip, "node1"), meshWorkload("c", c.ip, "node1"))
	n.add(t, "uid-a", a, "a")
	n.add(t, "uid-c", c, "c")
	n.snapshotSent(t)
	eventually(t, 10*time.Second, "node1 ready", func() bool { return strings.HasPrefix(n.readiness(t), "ready") })

	conn, err := dialFrom(t, a, c.ip+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write(make([]byte, 5000)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}

	read := func() liveSharedJSON {
		var v liveSharedJSON
		body := get(t, "http://"+n.AdminAddr().String()+"/debug/live")
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			t.Fatalf("/debug/live: %v\n%s", err, body)
		}
		return v
	}
	var v liveSharedJSON
	eventually(t, 5*time.Second, "pod a's outbound connection with its 5000 bytes", func() bool {
		v = read()
		for _, sc := range v.Connections.Shown {
			if sc.Direction == "outbound" && strings.HasPrefix(sc.Src, a.ip+":") && sc.OriginalDst == c.ip+":8080" &&
				sc.RequestBytes >= 5000 && sc.BytesLive && sc.SrcIdentity == "spiffe://cluster.local/ns/demo/sa/a" {
				return true
			}
		}
		return false
	})
	if v.Mode != "shared" || !v.Connections.Listed || v.Connections.Total < 2 {
		t.Errorf("mode %q, listed %v, %d connections; want shared, listed, the outbound and inbound sides", v.Mode, v.Connections.Listed, v.Connections.Total)
	}
	got := map[string]string{}
	for _, w := range v.Workloads {
		got[w.UID] = w.Name + " " + w.State + " " + w.Identity
	}
	for uid, want := range map[string]string{
		"Kubernetes//Pod/demo/a": "a Up spiffe://cluster.local/ns/demo/sa/a",
		"Kubernetes//Pod/demo/c": "c Up spiffe://cluster.local/ns/demo/sa/c",
	} {
		if got[uid] != want {
			t.Errorf("workload %s shown as %q, want %q (all: %v)", uid, got[uid], want, got)
		}
	}
	if zds := v.ControlPlane["zds"]; zds.State != "connected" || zds.Address != n.opts.Env.InpodUDS {
		t.Errorf("zds link = %+v, want connected to %s", zds, n.opts.Env.InpodUDS)
	}
	if xds := v.ControlPlane["xds"]; xds.State != "connected" {
		t.Errorf("xds link = %+v, want connected", xds)
	}
}
