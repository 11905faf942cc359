// Package telemetry is what the proxies of a process report: the traffic
// metrics (istio_tcp_* with their series swept, and gozt's own counters),
// each connection's record from open to close with its access log lines,
// the authorization log, the recent denials and the list of live
// connections.
//
// Metrics and Denials are built once per process and handed to every
// proxy, which all record into them concurrently; nothing in them belongs
// to one proxy or workload. A ConnList is one proxy's, a Record one
// connection's. The package never imports proxy.
package telemetry
