package node

import (
	"github.com/gozt/gozt/cmd/gozt/internal/admin"
	"github.com/gozt/gozt/proxy/inpod"
	"github.com/gozt/gozt/state"
)

// live is what the admin live view shows: the workloads this node serves
// (dedicated mode's one, or every pod istio-cni handed over), their
// connections and denials, and the xDS, CA and
// (shared mode) ZDS connections.
func (n *Node) live() admin.LiveInput {
	env := n.opts.Env
	snap := n.store.Snapshot()
	in := admin.LiveInput{Mode: env.ProxyMode, Certs: n.certs.States()}
	if n.pods != nil {
		n.pods.addLive(&in, snap)
	} else if n.proxy != nil {
		in.ConnsListed = true // workloadState lists them in every mode
		in.AddWorkload(n.findLocal(snap), "")
		in.AddConns(n.proxy)
	}
	in.SetDenials(n.svc.Denials)
	if n.xds != nil {
		st := n.xds.Status()
		in.XDS = admin.NewLink(env.XDSAddress, st.Connected, st.Since, st.LastError)
	} else {
		in.XDS = &admin.Link{State: admin.LinkStatic, Address: orDefault(env.LocalXDSPath, "LOCAL_XDS")}
	}
	st := n.certs.IssuerStatus()
	in.CA = admin.NewLink(env.CAAddress, st.OK, st.Since, st.LastError)
	if n.pods != nil {
		zs := n.pods.mgr.Status()
		in.ZDS = admin.NewLink(orDefault(env.InpodUDS, inpod.DefaultPath), zs.Connected, zs.Since, zs.LastError)
	}
	return in
}

// addLive adds every pod istio-cni handed over to in, with the connections
// of those that are up.
func (ps *pods) addLive(in *admin.LiveInput, snap *state.Snapshot) {
	env := ps.n.opts.Env
	in.ConnsListed = true // shared mode's proxies keep their list (workloadState)
	states, running := ps.handedOver()
	for _, st := range states {
		if w := snap.FindWorkload(env.NodeName, st.Info.Namespace, st.Info.Name, st.Info.ServiceAccount); w != nil {
			in.AddWorkload(w, st.State)
		} else {
			in.Workloads = append(in.Workloads, admin.LiveWorkload{
				UID: st.UID, Name: st.Info.Name, Namespace: st.Info.Namespace,
				Identity: ps.identity(st.Info), State: st.State,
			})
		}
		if pp := running[st.UID]; pp != nil {
			in.AddConns(pp.p)
		}
	}
}
