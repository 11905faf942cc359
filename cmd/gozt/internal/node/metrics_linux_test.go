package node

import (
	"testing"

	"github.com/gozt/gozt/internal/nstest"
)

// TestDashboardSeriesAtStartShared: in shared mode, where the inpod
// manager registers the workload manager series itself, every dashboard
// series exists right after start-up too, registered once.
func TestDashboardSeriesAtStartShared(t *testing.T) {
	nstest.RequireRoot(t, "ip", "iptables-restore")
	cp := newControlPlane(t)
	checkStartupSeries(t, cp.startShared(t, "node1").Node)
}
