package sockopt

// CountConnectWaits counts finishConnect's waits for a connect in the
// runtime poller until restore is called.
func CountConnectWaits() (count func() int, restore func()) {
	n := 0
	testHookWaitConnect = func() { n++ }
	return func() int { return n }, func() { testHookWaitConnect = nil }
}
