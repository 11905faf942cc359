package nstest_test

import (
	"errors"
	"net"
	"os"
	"testing"

	"github.com/gozt/gozt/internal/nstest"
	"github.com/gozt/gozt/internal/proctest"
	"github.com/gozt/gozt/proxy/netns"
)

// TestInNetns checks that fn runs in the namespace, the caller's namespace
// is untouched, sockets made inside belong to the namespace, and fn's error
// and panic come back to the caller.
func TestInNetns(t *testing.T) {
	nstest.RequireRoot(t, "ip")
	path := "/run/netns/" + nstest.NewNetns(t)
	outside := nstest.CurrentNetns(t)

	var inside uint64
	var ln net.Listener
	if err := nstest.InNetns(path, func() (err error) {
		inside = nstest.CurrentNetns(t)
		ln, err = net.Listen("tcp4", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if inside == outside {
		t.Errorf("fn ran in netns inode %d, the caller's own", inside)
	}
	if got := nstest.CurrentNetns(t); got != outside {
		t.Errorf("caller's netns changed from %d to %d", outside, got)
	}
	// The listener lives in the namespace's own loopback, not ours.
	if c, err := net.Dial("tcp4", ln.Addr().String()); err == nil {
		c.Close()
		t.Errorf("dialed %v from outside the namespace; the listener was not made inside it", ln.Addr())
	}

	errFn := errors.New("fn failed")
	if err := nstest.InNetns(path, func() error { return errFn }); !errors.Is(err, errFn) {
		t.Errorf("InNetns error = %v, want fn's %v", err, errFn)
	}

	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Errorf("recovered %v, want fn's panic value", v)
			}
		}()
		nstest.InNetns(path, func() error { panic("boom") })
		t.Error("InNetns returned after fn panicked")
	}()
	if got := nstest.CurrentNetns(t); got != outside {
		t.Errorf("caller's netns changed from %d to %d after a panic", outside, got)
	}
}

// TestInNetnsFDClosesBeforeReturning: InNetnsFD's goroutine opens the
// namespace its thread came from, and must have closed it when InNetnsFD
// returns. Closed after (a deferred close behind the result's send), it
// left the caller one descriptor fewer than it had for a while, and then one
// more: at the descriptor limit a dial could fail for a descriptor about to
// be freed, and TestDialInNetnsAtTheDescriptorLimit, whose namespace's
// listener is made through InNetns just before the limit is set, failed
// about once in a hundred runs with a descriptor free that it had counted
// as taken.
func TestInNetnsFDClosesBeforeReturning(t *testing.T) {
	nstest.RequireRoot(t)
	home, err := netns.Home()
	if err != nil {
		t.Fatal(err)
	}
	defer home.Close()
	release := nstest.HoldNetnsGoroutine()
	defer release()
	before := proctest.FDs(t, os.Getpid())
	if err := nstest.InNetnsFD(int(home.Fd()), func() error { return nil }); err != nil {
		t.Fatalf("InNetnsFD: %v", err)
	}
	after := proctest.FDs(t, os.Getpid())
	release()
	if len(after) != len(before) {
		t.Errorf("InNetnsFD returned with %d descriptors open, %d before it: %v, then %v", len(after), len(before), before, after)
	}
}

func TestInNetnsBadPath(t *testing.T) {
	called := false
	err := nstest.InNetns("/nonexistent/netns", func() error { called = true; return nil })
	if err == nil || called {
		t.Errorf("InNetns(missing path) = %v, fn called %v; want an error and no call", err, called)
	}
}
