package certs_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gozt/gozt/certs"
)

// TestIssuerStatus: IssuerStatus follows the issuer's outcomes: nothing
// before the first, a failure with its error, then a success that keeps the
// last error and moves Since; a caller that gives up changes nothing.
func TestIssuerStatus(t *testing.T) {
	f := newFakeIssuer(t, time.Hour)
	m := certs.NewManager(certs.ManagerConfig{Issuer: f})
	if st := m.IssuerStatus(); !st.Since.IsZero() || st.OK {
		t.Fatalf("IssuerStatus before any Issue = %+v, want zero", st)
	}

	f.mu.Lock()
	f.fail = errCADown
	f.mu.Unlock()
	if _, err := m.Get(context.Background(), idA); !errors.Is(err, errCADown) {
		t.Fatalf("Get = %v, want %v", err, errCADown)
	}
	failed := m.IssuerStatus()
	if failed.OK || failed.Since.IsZero() || !strings.Contains(failed.LastError, errCADown.Error()) || !failed.LastIssued.IsZero() {
		t.Errorf("IssuerStatus after a failure = %+v, want not OK since now with %q", failed, errCADown)
	}

	f.mu.Lock()
	f.fail = nil
	f.mu.Unlock()
	if _, err := m.Get(context.Background(), idA); err != nil {
		t.Fatal(err)
	}
	ok := m.IssuerStatus()
	if !ok.OK || ok.Since.Before(failed.Since) || ok.LastIssued.IsZero() || ok.LastError != failed.LastError {
		t.Errorf("IssuerStatus after a success = %+v, want OK since the success, the last error kept", ok)
	}

	f.mu.Lock()
	f.block = make(chan struct{})
	f.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Get(ctx, idB); err == nil {
		t.Fatal("Get with a cancelled context succeeded")
	}
	if st := m.IssuerStatus(); st != ok {
		t.Errorf("IssuerStatus after a cancelled Get = %+v, want unchanged %+v", st, ok)
	}
}
