//go:build !linux

package inpod

import "os"

// OpenNetns is Linux-only; elsewhere it returns an error wrapping
// errors.ErrUnsupported.
func OpenNetns(path string) (*Netns, error) { return nil, errUnsupported }

// NewNetns is Linux-only; elsewhere it closes f and returns an error
// wrapping errors.ErrUnsupported.
func NewNetns(f *os.File) (*Netns, error) {
	f.Close()
	return nil, errUnsupported
}

// Run is Linux-only; elsewhere it returns an error wrapping
// errors.ErrUnsupported without calling fn.
func (n *Netns) Run(fn func() error) error { return errUnsupported }

// Enter is Linux-only; elsewhere it returns an error wrapping
// errors.ErrUnsupported without calling fn.
func (n *Netns) Enter(fn func(leave func() error) error) error { return errUnsupported }
