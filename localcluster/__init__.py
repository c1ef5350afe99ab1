"""A real local control plane for tests and `make up`: etcd, kube-apiserver, kube-scheduler,
kube-controller-manager and kwok, built from the Go module proxy and run as processes on 127.0.0.1."""
