// Command etcd is the published etcd server module wrapped in a main package,
// so the local control plane can be built from the Go module proxy alone.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
