package dns

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/gozt/gozt/internal/nstest"
	"github.com/gozt/gozt/state"
)

// TestSpoofedSelfResponse (tier 3, issue 36 item 1): one UDP datagram
// whose source is the proxy's own address and port, injected through a raw
// socket as any pod with CAP_NET_RAW could on its own loopback, is read
// once and never answered, whether it is a response (QR=1) or a query. A
// proxy that answers a response (FORMERR, itself a response) answers
// itself again and again: tens of thousands of datagrams a second, counted
// here by the namespace's Udp InDatagrams, which the kernel counts as a
// socket reads a datagram. A proxy that answers a query from itself reads
// its own answer.
func TestSpoofedSelfResponse(t *testing.T) {
	nstest.RequireRoot(t, "ip")
	for _, tc := range []struct {
		name     string
		response bool
	}{
		{"response", true},
		{"query", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := question("svc1", dns.TypeA)
			m.Id = 0x3636
			m.Response = tc.response
			if got := selfDatagrams(t, mustPack(t, m)); got != 1 {
				t.Errorf("datagrams read in the namespace in the second after one spoofed from the proxy's address to itself: %d, want 1", got)
			}
		})
	}
}

// selfDatagrams serves a DNS proxy on 127.0.0.1:15053 in a new network
// namespace, injects payload there in a datagram from 127.0.0.1:15053 to
// itself, and returns how many UDP datagrams sockets in the namespace read
// in the second after.
func selfDatagrams(t *testing.T, payload []byte) uint64 {
	t.Helper()
	ns := "/run/netns/" + nstest.NewNetns(t)
	st := newTestStore(t)
	self := netip.MustParseAddrPort("127.0.0.1:15053")
	srv := NewServer(ServerConfig{
		Resolver: NewResolver(Config{Metrics: NewMetrics(prometheus.NewRegistry())}),
		Local: func(context.Context) (*state.Snapshot, *state.Workload) {
			return st.Snapshot(), testClient
		},
		Addrs:   []netip.AddrPort{self},
		InNetns: nstest.InNetnsPath(ns),
	})
	runServer(t, srv)
	before := udpInDatagrams(t, ns)
	if err := nstest.InNetns(ns, func() error { return sendRawUDP(self, self, payload) }); err != nil {
		t.Fatalf("inject the datagram: %v", err)
	}
	time.Sleep(time.Second)
	return udpInDatagrams(t, ns) - before
}

// udpInDatagrams reads Udp InDatagrams of /proc/net/snmp in the network
// namespace at path.
func udpInDatagrams(t *testing.T, path string) uint64 {
	t.Helper()
	var snmp []byte
	err := nstest.InNetns(path, func() (err error) {
		// thread-self: the namespace of this thread, which InNetns moved.
		snmp, err = os.ReadFile("/proc/thread-self/net/snmp")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	n, err := snmpValue(snmp, "Udp", "InDatagrams")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// snmpValue returns field of proto in /proc/net/snmp's text: a line of
// names then a line of values, each starting with "proto:".
func snmpValue(snmp []byte, proto, field string) (uint64, error) {
	var names []string
	sc := bufio.NewScanner(bytes.NewReader(snmp))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != proto+":" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, name := range names {
			if name == field && i < len(f) {
				return strconv.ParseUint(f[i], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no %s %s in /proc/net/snmp", proto, field)
}

// sendRawUDP sends payload in one UDP datagram from src to dst (IPv4),
// writing the IPv4 and UDP headers itself through an IPPROTO_RAW socket
// (which implies IP_HDRINCL), so the source can be any address and port.
func sendRawUDP(src, dst netip.AddrPort, payload []byte) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return fmt.Errorf("raw socket: %w", err)
	}
	defer unix.Close(fd)
	pkt := ipv4UDP(src, dst, payload)
	return unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: dst.Addr().As4()})
}

// ipv4UDP builds an IPv4 packet (RFC 791) holding one UDP datagram
// (RFC 768) of payload from src to dst. The UDP checksum is 0, "no
// checksum", which IPv4 allows.
func ipv4UDP(src, dst netip.AddrPort, payload []byte) []byte {
	const ipLen, udpLen = 20, 8
	pkt := make([]byte, ipLen+udpLen+len(payload))
	ip := pkt[:ipLen]
	ip[0] = 4<<4 | ipLen/4 // version, header length in 32-bit words
	binary.BigEndian.PutUint16(ip[2:], uint16(len(pkt)))
	ip[6] = 0x40 // don't fragment
	ip[8] = 64   // TTL
	ip[9] = unix.IPPROTO_UDP
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
	udp := pkt[ipLen:]
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(udpLen+len(payload)))
	copy(udp[udpLen:], payload)
	return pkt
}

// ipChecksum is the Internet checksum of an IPv4 header whose checksum
// field is zero (RFC 1071).
func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
