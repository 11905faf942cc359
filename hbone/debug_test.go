package hbone

import (
	"log/slog"
	"os"
	"testing"
)

// dumpConn logs a connection's state, for failing tests.
func dumpConn(t testing.TB, c *conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t.Logf("err=%v goAwaySent=%v goAwayRecv=%v active=%d nextID=%d peerMax=%d", c.err, c.goAwaySent, c.goAwayRecv, c.active, c.nextID, c.peerMaxStreams)
}

// isUsable reports whether the connection may take new streams at all.
func (c *conn) isUsable() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err == nil && !c.goAwaySent && !c.goAwayRecv
}

// debugLogger logs to stderr at debug level when HBONE_DEBUG is set, and
// discards otherwise.
func debugLogger() *slog.Logger {
	if os.Getenv("HBONE_DEBUG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
