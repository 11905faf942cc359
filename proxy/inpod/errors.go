package inpod

import (
	"errors"
	"fmt"
)

// ErrProtocol is wrapped by the error Run returns when istio-cni breaks the
// ZDS protocol (SPEC §9: AddWorkload without workload_info, KeepWorkload
// after SnapshotSent, a second SnapshotSent). The process is then expected to
// exit with status 1.
var ErrProtocol = errors.New("inpod: zds protocol error")

var (
	errNoStart      = errors.New("inpod: Config.Start is nil")
	errRunTwice     = errors.New("inpod: Run called twice")
	errTruncated    = errors.New("inpod: zds message longer than 1024 bytes")
	errCtrlTrunc    = errors.New("inpod: zds control data truncated")
	errNoPayload    = errors.New("inpod: zds request without a known payload")
	errNilPod       = errors.New("inpod: start returned neither a pod nor an error")
	errConnFinished = errors.New("inpod: zds connection reader finished")
)

// wrapErr prefixes err with the package name.
func wrapErr(err error) error {
	return fmt.Errorf("inpod: %w", err)
}

// protocolError returns an error wrapping ErrProtocol.
func protocolError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrProtocol, fmt.Sprintf(format, args...))
}
