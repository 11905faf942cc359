package logscope

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"testing"
)

// BenchmarkAccessLine logs one access line shaped as a proxy's
// "connection complete" (SPEC §7.3: 15 attributes, three of them
// addresses) through the handler gozt runs with, at the default level,
// into io.Discard: what each connection costs each proxy in logging.
func BenchmarkAccessLine(b *testing.B) {
	for _, format := range []string{FormatPlain, FormatJSON} {
		b.Run(format, func(b *testing.B) {
			f, err := Parse("info")
			if err != nil {
				b.Fatal(err)
			}
			log := NewLogger(io.Discard, format, NewLevels(f)).With("scope", "access")
			src := netip.MustParseAddrPort("10.244.0.9:43210")
			dst := netip.MustParseAddrPort("10.244.1.7:8080")
			hbone := netip.MustParseAddrPort("10.244.1.7:15008")
			b.ReportAllocs()
			for b.Loop() {
				attrs := make([]slog.Attr, 0, 20)
				attrs = append(attrs,
					slog.Any("src.addr", src),
					slog.String("src.workload", "sleep-7f8d9c6b5-x2x9q"),
					slog.String("src.namespace", "default"),
					slog.String("src.identity", "spiffe://cluster.local/ns/default/sa/sleep"),
					slog.Any("dst.addr", dst),
					slog.Any("dst.hbone_addr", hbone),
					slog.String("dst.service", "httpbin.default.svc.cluster.local"),
					slog.String("dst.workload", "httpbin-5d9c8f7b6-abcde"),
					slog.String("dst.namespace", "default"),
					slog.String("dst.identity", "spiffe://cluster.local/ns/default/sa/httpbin"),
					slog.String("direction", "outbound"),
					slog.Int64("bytes_sent", 1234),
					slog.Int64("bytes_recv", 56789),
					slog.String("duration", "12ms"),
				)
				log.LogAttrs(context.Background(), slog.LevelInfo, "connection complete", attrs...)
			}
		})
	}
}
