//go:build tools

// Package tools names the commands scripts/build-node builds, so `go mod tidy` keeps their dependencies.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubelet"
)
