// Command etcd is etcd's server, built from go.etcd.io/etcd/server/v3 at the
// version Kubernetes' own go.mod pins, for the e2e cluster's API server.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
