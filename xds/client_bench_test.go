package xds

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"istio.io/istio/pkg/workloadapi"

	"github.com/gozt/gozt/internal/gctest"
	"github.com/gozt/gozt/state"
)

// benchPush builds one Address response with the given numbers of
// workloads (each an endpoint of one service) and services.
func benchPush(b testing.TB, workloads, services int) *discoveryv3.DeltaDiscoveryResponse {
	resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: AddressTypeURL, Nonce: "n"}
	add := func(name string, a *workloadapi.Address) {
		payload, err := anypb.New(a)
		if err != nil {
			b.Fatal(err)
		}
		resp.Resources = append(resp.Resources, &discoveryv3.Resource{Name: name, Version: "v1", Resource: payload})
	}
	for i := range services {
		host := fmt.Sprintf("svc%d.ns%d.svc.cluster.local", i, i%50)
		add(fmt.Sprintf("ns%d/%s", i%50, host), ServiceAddress(&workloadapi.Service{
			Name: fmt.Sprintf("svc%d", i), Namespace: fmt.Sprintf("ns%d", i%50), Hostname: host,
			Addresses: []*workloadapi.NetworkAddress{{Address: []byte{10, 96, byte(i >> 8), byte(i)}}},
			Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}, {ServicePort: 443, TargetPort: 8443}},
		}))
	}
	for i := range workloads {
		svc := i % services
		ns := fmt.Sprintf("ns%d", svc%50)
		uid := fmt.Sprintf("Kubernetes//Pod/%s/pod-%d", ns, i)
		add(uid, WorkloadAddress(&workloadapi.Workload{
			Uid: uid, Name: fmt.Sprintf("pod-%d", i), Namespace: ns,
			Addresses:      [][]byte{{10, byte(i >> 16), byte(i >> 8), byte(i)}},
			TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
			ServiceAccount: "sa", Node: fmt.Sprintf("node-%d", i%100),
			WorkloadType: workloadapi.WorkloadType_POD, WorkloadName: fmt.Sprintf("deploy-%d", svc),
			CanonicalName: fmt.Sprintf("app-%d", svc), CanonicalRevision: "v1", ClusterId: "Kubernetes",
			Services: map[string]*workloadapi.PortList{
				fmt.Sprintf("%s/svc%d.%s.svc.cluster.local", ns, svc, ns): {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}},
			},
		}))
	}
	return resp
}

// reusable returns a response with resp's resources, for handing to
// handleResponse, which consumes its argument's resource list.
func reusable(resp *discoveryv3.DeltaDiscoveryResponse) *discoveryv3.DeltaDiscoveryResponse {
	return &discoveryv3.DeltaDiscoveryResponse{
		TypeUrl:          resp.GetTypeUrl(),
		Nonce:            resp.GetNonce(),
		Resources:        slices.Clone(resp.GetResources()),
		RemovedResources: resp.GetRemovedResources(),
	}
}

// benchmarkApplyPush measures decoding, converting and applying one push
// into an empty store, the work done per response off the data path. It
// reports time and bytes allocated per workload (services included in the
// total).
func benchmarkApplyPush(b *testing.B, workloads, services int) {
	resp := benchPush(b, workloads, services)
	b.ReportAllocs()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var gcs uint64
	b.ResetTimer()
	for b.Loop() {
		st := state.NewStore(state.Config{})
		c, err := NewClient(Config{Address: "https://istiod:15012", TLS: &tls.Config{}, Store: st, TunePushes: true})
		if err != nil {
			b.Fatal(err)
		}
		g := gcCycles()
		if req, ack := c.handleResponse(reusable(resp), nil); !ack {
			b.Fatalf("NACK: %s", req.GetErrorDetail().GetMessage())
		}
		gcs += gcCycles() - g
	}
	b.StopTimer()
	runtime.ReadMemStats(&after)
	n := float64(b.N) * float64(workloads)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/workload")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/n, "B/workload")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/n, "allocs/workload")
	b.ReportMetric(float64(gcs)/float64(b.N), "gc/op")
}

// gcCycles returns the number of garbage collections completed so far.
func gcCycles() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// BenchmarkApplyPush10k: 10,000 workloads and 1,000 services in one
// response.
func BenchmarkApplyPush10k(b *testing.B) { benchmarkApplyPush(b, 10_000, 1_000) }

// BenchmarkApplyPush100k: 100,000 workloads and 10,000 services in one
// response.
func BenchmarkApplyPush100k(b *testing.B) { benchmarkApplyPush(b, 100_000, 10_000) }

// wireBuffers returns resp's wire form cut into the 16 KiB pieces gRPC's
// transport hands a codec (one per HTTP/2 DATA frame at the default
// frame size).
func wireBuffers(b testing.TB, resp *discoveryv3.DeltaDiscoveryResponse) mem.BufferSlice {
	wire, err := proto.Marshal(resp)
	if err != nil {
		b.Fatal(err)
	}
	var data mem.BufferSlice
	for len(wire) > 0 {
		n := min(len(wire), 16<<10)
		data = append(data, mem.SliceBuffer(wire[:n]))
		wire = wire[n:]
	}
	return data
}

// BenchmarkReceivePush100k measures a 100,000-workload push from the
// moment gRPC has its bytes: the stream's codec (pushCodec) unmarshals the
// DeltaDiscoveryResponse, then handleResponse decodes, converts and
// applies it. Besides B/op it reports the garbage collections per push
// (gc/op), and those that ran while the codec unmarshalled
// (unmarshal-gc/op), before handleResponse could relax the collector.
func BenchmarkReceivePush100k(b *testing.B) {
	data := wireBuffers(b, benchPush(b, 100_000, 10_000))
	codec := newPushCodec(true)
	b.ReportAllocs()
	var gcs, unmarshalGCs uint64
	for b.Loop() {
		b.StopTimer()
		st := state.NewStore(state.Config{})
		c, err := NewClient(Config{Address: "https://istiod:15012", TLS: &tls.Config{}, Store: st, TunePushes: true})
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		b.StartTimer()
		g := gcCycles()
		resp := new(discoveryv3.DeltaDiscoveryResponse)
		if err := codec.Unmarshal(data, resp); err != nil {
			b.Fatal(err)
		}
		unmarshalGCs += gcCycles() - g
		if req, ack := c.handleResponse(resp, codec.take(resp)); !ack {
			b.Fatalf("NACK: %s", req.GetErrorDetail().GetMessage())
		}
		gcs += gcCycles() - g
	}
	b.ReportMetric(float64(gcs)/float64(b.N), "gc/op")
	b.ReportMetric(float64(unmarshalGCs)/float64(b.N), "unmarshal-gc/op")
}

// BenchmarkReaderDuringPush100k measures what a data-path reader sees while
// a 100,000-workload push is applied: it looks a workload up by IP in a
// loop and reports the longest single lookup (max-read-ns). Readers load an
// immutable snapshot, so a lookup never waits for the writer; what remains
// is scheduling and GC on a shared machine.
func BenchmarkReaderDuringPush100k(b *testing.B) {
	resp := benchPush(b, 100_000, 10_000)
	var worst time.Duration
	for b.Loop() {
		st := state.NewStore(state.Config{})
		c, err := NewClient(Config{Address: "https://istiod:15012", TLS: &tls.Config{}, Store: st, TunePushes: true})
		if err != nil {
			b.Fatal(err)
		}
		stop := make(chan struct{})
		done := make(chan time.Duration)
		go func() {
			ip := netip.AddrFrom4([4]byte{10, 0, 1, 2})
			var max time.Duration
			for {
				select {
				case <-stop:
					done <- max
					return
				default:
				}
				t0 := time.Now()
				st.Snapshot().WorkloadByIP("", ip)
				if d := time.Since(t0); d > max {
					max = d
				}
			}
		}()
		if req, ack := c.handleResponse(reusable(resp), nil); !ack {
			b.Fatalf("NACK: %s", req.GetErrorDetail().GetMessage())
		}
		close(stop)
		worst = max(worst, <-done)
	}
	b.ReportMetric(float64(worst.Nanoseconds()), "max-read-ns")
}

// BenchmarkNetDuringPush100k measures what a connection served by this
// process sees while a 100,000-workload push is received, as gozt bench's
// xds-push scenario does through the proxies: a goroutine echoes a
// loopback TCP connection, and a prober in a separate process (this test
// binary, see TestHelperProber) sends it a 1-byte round trip every
// millisecond. The push goes the way a received one does: the stream's
// codec unmarshals its wire form (pushCodec), then handleResponse decodes,
// converts and applies it. The echo goroutine is woken by the network
// poller only, so the longest round trip during the push (max-rtt-ns) is
// the time a network-ready goroutine waits for a P, or its thread for a
// CPU, while the push and its garbage collections run. The longest round
// trip over a window before the push, as long as the previous push took
// (calm-max-rtt-ns), is the same machine's noise, for comparison; the
// prober's own runtime is not disturbed by either.
func BenchmarkNetDuringPush100k(b *testing.B) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	data := wireBuffers(b, benchPush(b, 100_000, 10_000))
	codec := newPushCodec(true)
	var worst, calm time.Duration
	var gcs uint64
	calmFor := 1500 * time.Millisecond // until a push has been timed
	for b.Loop() {
		st := state.NewStore(state.Config{})
		c, err := NewClient(Config{Address: "https://istiod:15012", TLS: &tls.Config{}, Store: st, TunePushes: true})
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProber$")
		cmd.Env = append(os.Environ(), "XDS_HELPER_PROBER="+l.Addr().String())
		stdin, err := cmd.StdinPipe()
		if err != nil {
			b.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		lines := bufio.NewScanner(stdout)
		// window asks the prober for the longest round trip since the
		// previous ask.
		window := func() time.Duration {
			if _, err := io.WriteString(stdin, "\n"); err != nil {
				b.Fatalf("prober: %v", err)
			}
			if !lines.Scan() {
				b.Fatalf("prober ended: %v", lines.Err())
			}
			var ns int64
			if _, err := fmt.Sscan(lines.Text(), &ns); err != nil {
				b.Fatalf("prober output %q: %v", lines.Text(), err)
			}
			return time.Duration(ns)
		}
		conn, err := l.Accept()
		if err != nil {
			b.Fatal(err)
		}
		echoed := make(chan struct{})
		go func() {
			defer close(echoed)
			var buf [1]byte
			for {
				if _, err := io.ReadFull(conn, buf[:]); err != nil {
					return
				}
				if _, err := conn.Write(buf[:]); err != nil {
					return
				}
			}
		}()
		time.Sleep(20 * time.Millisecond) // the prober's first round trips
		window()
		time.Sleep(calmFor)
		calm = max(calm, window())
		g := gcCycles()
		t0 := time.Now()
		resp := new(discoveryv3.DeltaDiscoveryResponse)
		if err := codec.Unmarshal(data, resp); err != nil {
			b.Fatal(err)
		}
		if req, ack := c.handleResponse(resp, codec.take(resp)); !ack {
			b.Fatalf("NACK: %s", req.GetErrorDetail().GetMessage())
		}
		calmFor = time.Since(t0)
		gcs += gcCycles() - g
		worst = max(worst, window())
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			b.Fatalf("prober: %v", err)
		}
		conn.Close()
		<-echoed
	}
	b.ReportMetric(float64(worst.Nanoseconds()), "max-rtt-ns")
	b.ReportMetric(float64(calm.Nanoseconds()), "calm-max-rtt-ns")
	b.ReportMetric(float64(gcs)/float64(b.N), "gc/op")
}

// TestHelperProber is the prober process of BenchmarkNetDuringPush100k, and
// does nothing in a normal test run. It dials XDS_HELPER_PROBER and sends a
// 1-byte round trip every millisecond; for each line on its stdin it
// prints the longest round trip since the previous line, in nanoseconds,
// and it exits when its stdin closes.
func TestHelperProber(t *testing.T) {
	addr := os.Getenv("XDS_HELPER_PROBER")
	if addr == "" {
		return
	}
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var longest atomic.Int64
	go func() {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			fmt.Println(longest.Swap(0))
		}
		os.Exit(0)
	}()
	var buf [1]byte
	for {
		t0 := time.Now()
		if _, err := conn.Write(buf[:]); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(conn, buf[:]); err != nil {
			t.Fatal(err)
		}
		d := int64(time.Since(t0))
		for {
			old := longest.Load()
			if d <= old || longest.CompareAndSwap(old, d) {
				break
			}
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkStoreMark100k measures what a 100,000-workload store (the push
// of BenchmarkApplyPush100k, applied) and the client's table of the
// versions it holds cost every garbage collection once they are live
// (before 2026-12-02 17:00 UTC the client was left out): each iteration is one forced collection; mark-ms/gc is the
// mark CPU it took (assists and background workers, from runtime/metrics)
// and heap-MB the live heap after it. The push stall of gozt bench's
// xds-push scenario is mostly this work competing with the data path for
// the CPUs; compare runs of this benchmark, not its absolute figure.
func BenchmarkStoreMark100k(b *testing.B) {
	st := state.NewStore(state.Config{})
	c, err := NewClient(Config{Address: "https://istiod:15012", TLS: &tls.Config{}, Store: st, TunePushes: true})
	if err != nil {
		b.Fatal(err)
	}
	if req, ack := c.handleResponse(reusable(benchPush(b, 100_000, 10_000)), nil); !ack {
		b.Fatalf("NACK: %s", req.GetErrorDetail().GetMessage())
	}
	gctest.ReportMarkCPU(b, []any{st, c})
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapAlloc)/1e6, "heap-MB")
	if st.Snapshot().WorkloadByUID("Kubernetes//Pod/ns0/pod-0") == nil {
		b.Fatal("the store lost its workloads") // and keeps st live to here
	}
}
