// Package bench is the benchmark harness behind `gozt bench` (the binary
// cmd/gozt-bench) and `make bench` (issue 5): gozt's data path measured side
// by side with its peers in one run, every figure reported as a ratio
// against a baseline measured in the same run, because absolute figures on
// shared machines drift by 30–50%.
//
// # Running it
//
//	go run ./cmd/gozt-bench --quick                 every scenario, 3 short repetitions (< 2 min on 2 cores)
//	go run ./cmd/gozt-bench                         the thorough run (7 repetitions, longer runs)
//	go run ./cmd/gozt-bench --scenario hbone-up     one scenario (repeatable; --list shows them)
//	go run ./cmd/gozt-bench --json out.json         also write the JSON there
//	go run ./cmd/gozt-bench --cpuprofile-dir prof   a CPU and an allocation profile of every proxy process
//	go run ./cmd/gozt-bench --trace-dir tr          a runtime execution trace of every proxy process
//	go run ./cmd/gozt-bench --stalls tr             what each long round trip of xds-push's probe met in those traces
//
// Profiles and traces are named <scenario>-<process>.pprof (.trace), and
// <scenario>-<process>-2 and so on for a process a scenario starts again
// (idle memory starts its pair afresh for each repetition).
//
// Results go to bench/results/ (--out): <date>.json, <date>.md (a Markdown
// table) and <date>.svg (a bar chart of the ratios), each copied to
// latest.*; the table is also printed on stdout and progress (scenario,
// repetition, running median) on stderr. The JSON holds a "results" list of
// {scenario, metric, value, unit, baseline, baseline_value, ratio} (plus the
// target and whether it was met) and the "machine" (cores, kernel, go).
//
// # Method
//
// Each scenario starts the processes it needs, runs every variant once to
// warm up, then runs the variants interleaved (A B C, C B A, …) for the
// configured repetitions, and reports medians. Before each run it waits
// until /proc/stat shows the CPUs at least 70% idle over a short window,
// giving up after a cap (counted in the report's notes). CPU time per
// proxy is the utime+stime delta of its process (/proc/<pid>/stat), memory
// its VmRSS after a forced GC that returns freed memory to the OS.
//
// # Processes
//
// Every proxy runs in its own process, so that its CPU and memory can be
// read from /proc: the harness re-runs its own executable as
// `<exe> bench --role NAME ...` (cmd/gozt-bench's main passes every
// argument after "bench" to Run). Roles: "gozt" (gozt's proxy.Proxy per
// workload, assembled by envconfig's builder as `gozt proxy` assembles it
// in an empty environment, from a generated local config
// and a CA written to a temporary directory; the outbound and inbound workloads run in separate
// processes, as on two nodes; with --netns PATH, in shared mode, every
// socket made inside that network namespace through
// proxy.Config.InNetns), "xnet-out" and "xnet-in" (the x/net
// http2.Transport + http2.Server CONNECT pair with ztunnel's windows),
// "relay" (a plain Go splice relay), "app" (the test server: echo, sink and
// source over TCP and mutual TLS) and "xds" (xdsserver's fake istiod). HAProxy
// in TCP mode is started from PATH when installed (`apt-get install
// haproxy`); otherwise its rows are skipped with a note. The client side
// runs in the harness itself. Everything binds distinct loopback addresses
// under --net (default 127.55.0.0/16), and the harness reaches gozt and the
// x/net pair through SOCKS5, with the handshake pipelined into the first
// write. Children get stdin closed, then SIGKILL after 5 s; they are in
// their own process group and die with the harness (PR_SET_PDEATHSIG).
//
// The "shared" scenario (root only; skipped with a note otherwise) runs a
// second gozt pair in shared (in-pod) mode beside the dedicated one: each
// process starts in an empty network namespace of its own (CLONE_NEWNET,
// gone with the process, so nothing is left to clean up) and is handed the
// harness's namespace as its pod's, so that every listener and upstream
// socket it makes goes through InNetns while the traffic takes the same
// loopback path as in dedicated mode (shared.go).
//
// The "node" scenario (root only; skipped with a note otherwise) runs the
// gozt binary itself, `gozt proxy` in shared mode as the DaemonSet runs it
// (built from cmd/gozt into the run's directory, or --gozt PATH), with 110
// pods: network namespaces the harness makes (unshare on a locked thread,
// held by descriptors, so nothing outlives the run) and hands over through
// ZDS as istio-cni does (proxy/inpod/inpodtest), the fake istiod (the xds
// role with --ca, certs/istioca/istiocatest's CA) holding their workloads.
// gozt and istiod run in a namespace of their own, entered by re-running
// the harness as `<exe> bench --netns-exec PATH PROGRAM ARGS...`, so that
// gozt's fixed side ports (15000, 15020, 15021) meet nothing on the host. It
// reports ZDS add latency against the "bare-pods" role (a program that
// only enters each pod's namespace and opens the same sockets), restart
// re-adoption under clients, per-pod memory, goroutines, descriptors and
// idle CPU, and traffic spread over the pods against one pod (node.go).
// With --cpuprofile-dir it also writes gozt's CPU profiles (taken from its
// admin port) of Adds, of idle pods and of traffic, and its heap and
// goroutine profiles with no pod and with all.
//
// Only cmd/gozt-bench imports bench; the node binary, cmd/gozt, must not
// (deps_test.go).
package bench
