package sockopt

import (
	"sync"
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

// HoldNetnsGoroutine makes InNetnsFD's goroutine wait, once it has handed
// its result to the caller, until release is called, so that a test sees
// what that goroutine still holds when InNetnsFD returns.
func HoldNetnsGoroutine() (release func()) {
	ch := make(chan struct{})
	hook := func() { <-ch }
	testHookNetnsSent.Store(&hook)
	var once sync.Once
	return func() { once.Do(func() { testHookNetnsSent.Store(nil); close(ch) }) }
}
