package xdstest

import (
	"net"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestNewServerStopsWithTest: the server stops when the test that started it
// ends.
func TestNewServerStopsWithTest(t *testing.T) {
	var addr string
	t.Run("user", func(t *testing.T) {
		addr = NewServer(t, nil).Addr()
	})
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Errorf("server at %s still accepts connections after its test ended", addr)
	}
}
