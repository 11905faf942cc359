// Package logtest provides a log sink for tests that read what a component
// under test logs while it is still logging. It is for tests only; the gozt
// binary never links it.
package logtest

import (
	"bytes"
	"sync"
)

// Buffer is a log sink that a logger's goroutines may write and a test may
// read at once. The zero Buffer is empty and ready to use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p to the buffer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
