// Command gozt-e2e builds, brings up and tears down the e2e cluster (see
// e2e/README.md); the Makefile's e2e, e2e-up and e2e-down targets run it:
//
//	gozt-e2e build -repo DIR   build the Kubernetes and Istio binaries and the image archives
//	gozt-e2e up -repo DIR      bring the cluster up (tearing down any previous one first)
//	gozt-e2e down -repo DIR    tear it down
//	gozt-e2e logs -repo DIR    print the tail of every component's log and the events
//	gozt-e2e node -repo DIR    the node: containerd and the kubelet in a PID namespace (run by up)
//	gozt-e2e dns ...           the cluster's DNS server (run by up)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/gozt/gozt/e2e/internal/cluster"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "gozt-e2e:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 1 {
		return errors.New("usage: gozt-e2e build|up|down|logs|dns [flags]")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	repo := fs.String("repo", "..", "the gozt repository's root")
	kubeconfig := fs.String("kubeconfig", "", "dns: the API server's kubeconfig")
	addr := fs.String("addr", "", "dns: the address to serve on")
	lines := fs.Int("lines", 60, "logs: lines of each log")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	root, err := filepath.Abs(*repo)
	if err != nil {
		return err
	}
	c := &cluster.Config{Repo: root}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, a ...any) { log.Printf(format, a...) }
	start := time.Now()
	switch args[0] {
	case "build":
		err = c.Build(ctx, logf)
	case "up":
		if err = c.Up(ctx, os.Stderr); err == nil {
			fmt.Fprintf(os.Stderr, `e2e: the cluster is up (%v): Kubernetes with Istio's istiod and istio-cni, and gozt as ztunnel.
  export KUBECONFIG=%[2]s/kubeconfig PATH=%[2]s:$PATH
  kubectl get pods -A
  kubectl create namespace demo && kubectl label namespace demo istio.io/dataplane-mode=ambient
  kubectl -n demo run echo --image=%[3]s --image-pull-policy=Never --port=8080 -- serve
  istioctl ztunnel-config workloads
Tear it down with: make e2e-down
`, time.Since(start).Round(time.Second), c.BinDir(), cluster.EchoImage)
		}
	case "down":
		err = c.Down(ctx)
	case "logs":
		c.Logs(ctx, os.Stdout, *lines)
	case "node":
		err = c.RunNode(ctx)
	case "dns":
		err = cluster.ServeDNS(ctx, *kubeconfig, *addr)
	default:
		return fmt.Errorf("unknown command %q", args[0])
	}
	return err
}
