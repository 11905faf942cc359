package bench

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
)

// failingRole is a role whose background loop has failed.
type failingRole struct{ done chan struct{} }

func (failingRole) info() map[string]string { return nil }
func (failingRole) command(context.Context, string, []string) (string, error) {
	return "", errors.New("no commands")
}
func (failingRole) stats(map[string]any)      {}
func (failingRole) close() error              { return nil }
func (r failingRole) failed() <-chan struct{} { return r.done }

// TestServeRoleStopsOnFailure: a role whose loop fails ends serveRole with
// errRoleFailed instead of serving on, so the harness sees the role die.
func TestServeRoleStopsOnFailure(t *testing.T) {
	r := failingRole{done: make(chan struct{})}
	close(r.done)
	pr, pw := io.Pipe() // stdin that never ends
	defer pw.Close()
	var out strings.Builder
	if err := serveRole(context.Background(), r, pr, &out); !errors.Is(err, errRoleFailed) {
		t.Fatalf("serveRole = %v, want errRoleFailed", err)
	}
	if !strings.HasPrefix(out.String(), "ready ") {
		t.Errorf("output %q, want the ready line first", out.String())
	}
}
