package istioca

import "testing"

// ReplaceChannelOnce makes the next Issue find, between its connect and its
// call, that its failed channel was replaced, as a concurrent Issue would
// replace it (channel closes the old one).
func ReplaceChannelOnce(t testing.TB) {
	done := false
	testHookAfterConnect = func(c *Client) {
		if done {
			return
		}
		done = true
		if _, err := c.channel(); err != nil {
			t.Errorf("channel: %v", err)
		}
	}
	t.Cleanup(func() { testHookAfterConnect = nil })
}
