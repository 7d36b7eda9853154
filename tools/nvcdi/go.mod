// NVIDIA's CDI generator (pkg/nvcdi of the container toolkit, the same release as the nvidia-cdi-hook that
// scripts/build-cdi-hook builds) on go-nvml's mock devices: the judge of our CDI specs in the suite. Built by
// scripts/build-nvcdi.
module dradriver.local/nvcdi

go 1.26.0

require (
	github.com/NVIDIA/go-nvlib v0.12.0
	github.com/NVIDIA/go-nvml v0.13.4-1
	github.com/NVIDIA/nvidia-container-toolkit v1.20.2
	github.com/sirupsen/logrus v1.9.4
)

require (
	github.com/Masterminds/semver/v3 v3.5.0 // indirect
	github.com/fsnotify/fsnotify v1.7.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/moby/sys/devices v0.1.0 // indirect
	github.com/opencontainers/cgroups v0.1.0 // indirect
	github.com/opencontainers/runtime-spec v1.3.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.49.0 // indirect
	tags.cncf.io/container-device-interface v1.1.1 // indirect
	tags.cncf.io/container-device-interface/specs-go v1.1.1 // indirect
)
