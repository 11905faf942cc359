//go:build !linux

package proxy

// TryRead reads nothing: off Linux, ConnectEarly waits for the client's
// bytes on a goroutine of its own (hbone.EarlySource).
func (e *earlySource) TryRead(p []byte) (int, error) { return 0, nil }
