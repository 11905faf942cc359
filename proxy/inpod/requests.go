package inpod

import (
	"fmt"
	"os"

	"github.com/gozt/gozt/proxy/netns"
	"google.golang.org/protobuf/proto"
	"istio.io/istio/pkg/zdsapi"
)

// decodeRequest parses one datagram as a WorkloadRequest. Its errors are
// transport errors: the Manager NACKs and reconnects (SPEC §9,
// "Malformed/truncated messages").
func decodeRequest(d datagram) (*zdsapi.WorkloadRequest, error) {
	switch {
	case d.msgTrunc:
		return nil, errTruncated
	case d.ctrlTrunc:
		return nil, errCtrlTrunc
	}
	req := new(zdsapi.WorkloadRequest)
	if err := proto.Unmarshal(d.b, req); err != nil {
		return nil, wrapErr(fmt.Errorf("decode zds request: %w", err))
	}
	if req.GetPayload() == nil {
		return nil, errNoPayload
	}
	return req, nil
}

// requestKind names a request for logs.
func requestKind(req *zdsapi.WorkloadRequest) string {
	switch req.GetPayload().(type) {
	case *zdsapi.WorkloadRequest_Add:
		return "add"
	case *zdsapi.WorkloadRequest_Keep:
		return "keep"
	case *zdsapi.WorkloadRequest_Del:
		return "del"
	case *zdsapi.WorkloadRequest_SnapshotSent:
		return "snapshot_sent"
	}
	return "unknown"
}

// dispatch carries out one request and returns the Ack's error text (empty
// for success) and, if the connection must end, why. Only an Add uses
// files; dispatch closes the rest.
func (m *Manager) dispatch(s *session, req *zdsapi.WorkloadRequest, files []*os.File) (nack string, err error) {
	if _, isAdd := req.GetPayload().(*zdsapi.WorkloadRequest_Add); !isAdd {
		closeFiles(files)
	}
	switch p := req.GetPayload().(type) {
	case *zdsapi.WorkloadRequest_Add:
		s.log.Debug("zds add", "uid", p.Add.GetUid(), "fds", len(files))
		return m.add(s, p.Add, files)
	case *zdsapi.WorkloadRequest_Keep:
		s.log.Debug("zds keep", "uid", p.Keep.GetUid())
		err = m.keep(s, p.Keep.GetUid())
	case *zdsapi.WorkloadRequest_Del:
		s.log.Debug("zds del", "uid", p.Del.GetUid())
		m.del(s, p.Del.GetUid())
	case *zdsapi.WorkloadRequest_SnapshotSent:
		s.log.Debug("zds snapshot sent")
		err = m.snapshotSent(s)
	}
	if err != nil {
		return err.Error(), err
	}
	return "", nil
}

// add handles AddWorkload (SPEC §9, "Add handling"). A failed Start is
// NACKed with its error text but keeps the connection: the pod is pending.
func (m *Manager) add(s *session, a *zdsapi.AddWorkload, files []*os.File) (nack string, err error) {
	uid := a.GetUid()
	wi := a.GetWorkloadInfo()
	if wi == nil {
		closeFiles(files)
		err := protocolError("add workload %q without workload_info", uid)
		return err.Error(), err
	}
	if len(files) != 1 {
		closeFiles(files)
		err := wrapErr(fmt.Errorf("add workload %q: got %d fds, want 1", uid, len(files)))
		return err.Error(), err
	}
	ns, err := netns.New(files[0])
	if err != nil {
		err = fmt.Errorf("add workload %q: %w", uid, err)
		return err.Error(), err
	}
	if !s.snapshotDone {
		s.named[uid] = true
	}
	if p := m.pods[uid]; p != nil {
		if p.proxy != nil && p.ns.Same(ns) {
			ns.Close()
			s.log.Debug("pod already running in this netns", "uid", uid)
			return "", nil
		}
		// A new netns (the pod's sandbox was recreated) or a pending pod:
		// start over, now.
		s.log.Info("replacing pod proxies", "uid", uid, "pending", p.proxy == nil)
		m.removeAll([]*pod{p})
	}
	info := WorkloadInfo{Name: wi.GetName(), Namespace: wi.GetNamespace(), ServiceAccount: wi.GetServiceAccount()}
	if err := m.start(uid, info, ns); err != nil {
		return err.Error(), nil
	}
	return "", nil
}

// keep handles KeepWorkload: before SnapshotSent it names uid as a pod to
// keep; afterwards it is a protocol error.
func (m *Manager) keep(s *session, uid string) error {
	if s.snapshotDone {
		return protocolError("keep workload %q after snapshot_sent", uid)
	}
	s.named[uid] = true
	return nil
}

// del handles DelWorkload: before SnapshotSent it forgets uid from the
// snapshot; afterwards it stops the pod at once. An unknown uid is fine:
// istio-cni sends Del on every connection it has.
func (m *Manager) del(s *session, uid string) {
	if !s.snapshotDone {
		delete(s.named, uid)
		return
	}
	if p := m.pods[uid]; p != nil {
		m.removeAll([]*pod{p})
	}
}

// snapshotSent ends the snapshot: every pod it did not name is stopped at
// once (SPEC §9, step 3).
func (m *Manager) snapshotSent(s *session) error {
	if s.snapshotDone {
		return protocolError("second snapshot_sent")
	}
	var stale []*pod
	for uid, p := range m.pods {
		if !s.named[uid] {
			stale = append(stale, p)
		}
	}
	if len(stale) > 0 {
		s.log.Info("snapshot reconciled: stopping pods istio-cni no longer has", "count", len(stale))
	}
	m.removeAll(stale)
	s.snapshotDone = true
	s.named = nil
	m.updateReady()
	return nil
}
