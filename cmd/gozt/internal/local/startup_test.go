package local

import (
	"context"
	"net"
	"strings"
	"testing"
)

// TestStartFailuresLeaveNothing: a start-up failure after listeners were
// bound (a workload port or the admin port already taken) returns one error
// naming the address, does not crash, and leaves none of gozt's listeners
// behind (issue 14, defect 1).
func TestStartFailuresLeaveNothing(t *testing.T) {
	ip := "127.79.0.2"
	cfg := `workloads:
- uid: Kubernetes//Pod/demo/w
  name: w
  namespace: demo
  serviceAccount: w
  workloadIps: [` + ip + `]
  protocol: HBONE
`
	path := writeConfig(t, cfg)
	taken, err := net.Listen("tcp", ip+":15008")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	admin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()

	for _, tc := range []struct {
		name, adminAddr, want string
	}{
		{"workload port taken", "127.0.0.1:0", ip + ":15008"},
		{"admin port taken", admin.Addr().String(), admin.Addr().String()},
	} {
		if tc.name == "admin port taken" {
			taken.Close() // the workload's ports are free again
		}
		m, err := Start(context.Background(), Options{
			ConfigPath: path, AdminAddr: tc.adminAddr, MetricsAddr: "127.0.0.1:0", ReadinessAddr: "127.0.0.1:0",
		})
		if err == nil {
			m.Shutdown(context.Background())
			t.Fatalf("%s: Start succeeded", tc.name)
		}
		if m != nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: Start = %v, %v; want nil and one line naming %s", tc.name, m, err, tc.want)
		}
		for _, port := range []string{"15001", "15006"} {
			l, err := net.Listen("tcp", ip+":"+port)
			if err != nil {
				t.Errorf("%s: %s:%s still bound after the failed start: %v", tc.name, ip, port, err)
				continue
			}
			l.Close()
		}
	}
}
