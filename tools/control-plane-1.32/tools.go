//go:build tools

// Package tools names the command scripts/build-older-apiservers builds, so `go mod tidy` keeps its dependencies.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
