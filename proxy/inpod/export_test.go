package inpod

import "time"

// NextBackoffForTest exposes nextBackoff.
func NextBackoffForTest(prev, min, max time.Duration) time.Duration {
	return nextBackoff(prev, min, max)
}
