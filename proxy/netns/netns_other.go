//go:build !linux

package netns

import (
	"errors"
	"fmt"
	"os"
)

// errUnsupported is returned for everything this package cannot do outside
// Linux.
var errUnsupported = fmt.Errorf("netns: %w: not supported on this OS", errors.ErrUnsupported)

// Open is Linux-only; elsewhere it returns an error wrapping
// errors.ErrUnsupported.
func Open(path string) (*Handle, error) { return nil, errUnsupported }

// New is Linux-only; elsewhere it closes f and returns an error wrapping
// errors.ErrUnsupported.
func New(f *os.File) (*Handle, error) {
	f.Close()
	return nil, errUnsupported
}

// Run is Linux-only; elsewhere it returns an error wrapping
// errors.ErrUnsupported without calling fn.
func (h *Handle) Run(fn func() error) error { return errUnsupported }

// Enter is Linux-only; elsewhere it returns an error wrapping
// errors.ErrUnsupported without calling fn.
func (h *Handle) Enter(fn func(leave func() error) error) error { return errUnsupported }

// Home is Linux-only; elsewhere it returns an error wrapping
// errors.ErrUnsupported.
func Home() (*os.File, error) { return nil, errUnsupported }

// EnterFD is Linux-only; elsewhere it returns an error wrapping
// errors.ErrUnsupported without calling fn.
func EnterFD(nsfd, homefd int, fn func(leave func() error) error) error { return errUnsupported }
