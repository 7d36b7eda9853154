// Command cdi-apply applies CDI devices to an OCI runtime spec the way container runtimes do: through the CDI
// library (tags.cncf.io/container-device-interface) that containerd, CRI-O and podman call, so what a container
// gets is what a runtime would give it, not what a hand-written applier thinks the spec says.
//
//	cdi-apply -spec-dir DIR -config BUNDLE/config.json VENDOR/CLASS=NAME...
//
// The spec in -config is rewritten in place with every device's and spec's edits (environment, device nodes with
// their cgroup rules, mounts, hooks). It prints one JSON line: the devices injected, or the error, and exits 1 on
// an error. scripts/gpu-acceptance --prepare builds it (static, CGO off); the GPU acceptance kit runs it.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

type result struct {
	Injected   []string            `json:"injected,omitempty"`
	Error      string              `json:"error,omitempty"`
	SpecErrors map[string][]string `json:"specErrors,omitempty"`
}

func main() {
	specDir := flag.String("spec-dir", "", "the directory of CDI specs (only this one is read)")
	configPath := flag.String("config", "", "the OCI runtime spec (config.json) to edit in place")
	flag.Parse()
	out := apply(*specDir, *configPath, flag.Args())
	line, _ := json.Marshal(out)
	fmt.Println(string(line))
	if out.Error != "" {
		os.Exit(1)
	}
}

func apply(specDir, configPath string, devices []string) result {
	if specDir == "" || configPath == "" || len(devices) == 0 {
		return result{Error: "usage: cdi-apply -spec-dir DIR -config config.json DEVICE..."}
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(specDir), cdi.WithAutoRefresh(false))
	if err != nil {
		return result{Error: fmt.Sprintf("reading CDI specs in %s: %v", specDir, err), SpecErrors: specErrors(cache)}
	}
	raw, err := os.ReadFile(configPath)
	if err != nil {
		return result{Error: err.Error()}
	}
	var spec oci.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return result{Error: fmt.Sprintf("%s: %v", configPath, err)}
	}
	unresolved, err := cache.InjectDevices(&spec, devices...)
	if err != nil {
		return result{Error: fmt.Sprintf("injecting %v (unresolved %v): %v", devices, unresolved, err),
			SpecErrors: specErrors(cache)}
	}
	edited, err := json.MarshalIndent(&spec, "", "  ")
	if err == nil {
		err = os.WriteFile(configPath, edited, 0o644)
	}
	if err != nil {
		return result{Error: err.Error()}
	}
	return result{Injected: devices}
}

func specErrors(cache *cdi.Cache) map[string][]string {
	if cache == nil {
		return nil
	}
	found := map[string][]string{}
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			found[path] = append(found[path], e.Error())
		}
	}
	return found
}
