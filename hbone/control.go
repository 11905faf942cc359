package hbone

import (
	"strconv"
	"time"

	"golang.org/x/net/http2"
)

// processSettings applies the peer's SETTINGS (RFC 9113 §6.5) and
// acknowledges them.
func (c *conn) processSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	if c.abuse.settings.add(time.Now(), maxSettings) {
		return calm("too many SETTINGS")
	}
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingEnablePush:
			if !c.server && s.Val != 0 {
				return connError{http2.ErrCodeProtocol, "server enabled push"} // RFC 9113 §6.5.2
			}
		case http2.SettingInitialWindowSize:
			return c.setPeerInitialWindow(int64(s.Val))
		case http2.SettingMaxFrameSize:
			c.peerMaxFrame.Store(s.Val)
		case http2.SettingMaxConcurrentStreams:
			c.mu.Lock()
			c.peerMaxStreams = s.Val
			c.mu.Unlock()
		case http2.SettingHeaderTableSize:
			c.peerTableSize.Store(min(s.Val, 1<<20) + 1)
		}
		return nil
	})
	if err != nil {
		return frameReadError(err)
	}
	if !c.queueCtrl(ctrlFrame{kind: ctrlSettingsAck}) {
		return calm("control queue full")
	}
	if !c.sawSettings {
		c.sawSettings = true
		close(c.settingsCh)
		if c.server {
			c.nc.SetReadDeadline(time.Time{}) // the preface is complete
		}
	}
	return nil
}

// setPeerInitialWindow applies a new SETTINGS_INITIAL_WINDOW_SIZE to every
// open stream (RFC 9113 §6.9.2).
func (c *conn) setPeerInitialWindow(v int64) error {
	c.mu.Lock()
	delta := v - c.peerInitWin
	c.peerInitWin = v
	streams := make([]*stream, 0, len(c.streams))
	for _, s := range c.streams {
		streams = append(streams, s)
	}
	c.mu.Unlock()
	for _, s := range streams {
		s.mu.Lock()
		s.sendWin += delta
		over := s.sendWin > maxWindow
		s.wakeLocked()
		s.mu.Unlock()
		if over {
			return connError{http2.ErrCodeFlowControl, "stream window overflow"}
		}
	}
	return nil
}

func (c *conn) processPing(f *http2.PingFrame) error {
	if f.IsAck() {
		c.mu.Lock()
		if c.pingOut && f.Data == c.pingData {
			c.pingOut = false
		}
		c.mu.Unlock()
		return nil
	}
	if c.abuse.pings.add(time.Now(), maxPings) {
		return calm("too many PINGs")
	}
	if !c.queueCtrl(ctrlFrame{kind: ctrlPingAck, data: f.Data}) {
		return calm("control queue full")
	}
	return nil
}

// processGoAway records the peer's GOAWAY: no new streams; on a client,
// streams above its last stream id were not processed and fail with
// ErrRefused; the rest finish.
func (c *conn) processGoAway(f *http2.GoAwayFrame) {
	c.mu.Lock()
	if !c.goAwayRecv || f.LastStreamID < c.goAwayLastID {
		c.goAwayLastID = f.LastStreamID
	}
	c.goAwayRecv = true
	var refused []*stream
	if !c.server {
		for id, s := range c.streams {
			if id > c.goAwayLastID {
				refused = append(refused, s)
			}
		}
	}
	c.wakeStateLocked()
	c.mu.Unlock()
	if f.ErrCode != http2.ErrCodeNo {
		c.log.Debug("hbone: peer sent GOAWAY", "code", f.ErrCode, "remote", c.nc.RemoteAddr())
	}
	for _, s := range refused {
		s.refuse()
	}
	c.maybeFinish()
}

func (c *conn) processRST(f *http2.RSTStreamFrame) error {
	c.mu.Lock()
	s := c.streams[f.StreamID]
	idle := c.idleStreamLocked(f.StreamID)
	c.mu.Unlock()
	if idle {
		return connError{http2.ErrCodeProtocol, "RST_STREAM on idle stream"}
	}
	if s == nil {
		return nil
	}
	if c.server {
		s.mu.Lock()
		unanswered := s.flags&fResponded == 0
		s.mu.Unlock()
		if unanswered && c.abuse.peerResets.add(time.Now(), maxPeerResets) {
			return calm("too many streams reset before an answer")
		}
	}
	s.resetRemote(f.ErrCode)
	return nil
}

func (c *conn) processWindowUpdate(f *http2.WindowUpdateFrame) error {
	inc := int64(f.Increment)
	if f.StreamID == 0 {
		c.mu.Lock()
		c.sendWin += inc
		over := c.sendWin > maxWindow
		if c.winWake != nil {
			close(c.winWake)
			c.winWake = nil
		}
		c.mu.Unlock()
		if over {
			return connError{http2.ErrCodeFlowControl, "connection window overflow"}
		}
		return nil
	}
	c.mu.Lock()
	s := c.streams[f.StreamID]
	idle := c.idleStreamLocked(f.StreamID)
	c.mu.Unlock()
	if idle {
		return connError{http2.ErrCodeProtocol, "WINDOW_UPDATE on idle stream"}
	}
	if s == nil {
		return nil
	}
	s.mu.Lock()
	s.sendWin += inc
	over := s.sendWin > maxWindow
	s.wakeLocked()
	s.mu.Unlock()
	if over {
		return c.streamError(f.StreamID, http2.ErrCodeFlowControl)
	}
	return nil
}

// parseStatus parses a :status value: exactly three digits.
func parseStatus(v string) (int, bool) {
	if len(v) != 3 {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	return n, err == nil && n >= 100
}
