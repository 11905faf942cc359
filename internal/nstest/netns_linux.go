package nstest

import (
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// SocketNetns returns the inode of the network namespace socket c belongs
// to (SIOCGSKNS), whichever thread asks.
func SocketNetns(c syscall.Conn) (uint64, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var ino uint64
	var opErr error
	err = rc.Control(func(fd uintptr) {
		nsfd, err := unix.IoctlRetInt(int(fd), unix.SIOCGSKNS)
		if err != nil {
			opErr = fmt.Errorf("SIOCGSKNS: %w", err)
			return
		}
		defer unix.Close(nsfd)
		var st unix.Stat_t
		if opErr = unix.Fstat(nsfd, &st); opErr == nil {
			ino = st.Ino
		}
	})
	return ino, errors.Join(err, opErr)
}
