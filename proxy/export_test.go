package proxy

import (
	"net"
	"testing"
)

// SetHandlerHookForTest makes hook run before every connection's handler
// (and every inbound CONNECT's) until the test ends; a panic in hook is a
// panic in that handler (TESTPLAN F26). Tests that set it must not run in
// parallel.
func SetHandlerHookForTest(t testing.TB, hook func(listener string, c net.Conn)) {
	t.Cleanup(func() { testHookHandler = nil })
	testHookHandler = hook
}
