package sockopt

import (
	"sync/atomic"
)

// CountConnectWaits counts the dials that wait for a connect in the
// runtime poller until restore is called.
func CountConnectWaits() (count func() int, restore func()) {
	var n atomic.Int64
	hook := func() { n.Add(1) }
	testHookWaitConnect.Store(&hook)
	return func() int { return int(n.Load()) }, func() { testHookWaitConnect.Store(nil) }
}
