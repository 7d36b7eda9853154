package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	mocknvml "github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// node is the mock node a test describes: what NVML would report.
type node struct {
	DriverVersion     string `json:"driverVersion"`
	CudaDriverVersion int    `json:"cudaDriverVersion"`
	GPUs              []gpu  `json:"gpus"`
}

type gpu struct {
	UUID     string `json:"uuid"`
	Minor    int    `json:"minor"`
	PciBusID string `json:"pciBusId"` // e.g. 0000:07:00.0
	MIGs     []mig  `json:"migs"`
}

type mig struct {
	UUID   string `json:"uuid"`
	GI     int    `json:"gi"`
	CI     int    `json:"ci"`
	Slices int    `json:"slices"` // the GPU instance's slice count (3 for 3g.20gb); its compute instance takes all
}

func readNode(path string) (node, error) {
	var n node
	data, err := os.ReadFile(path)
	if err != nil {
		return n, err
	}
	if err := json.Unmarshal(data, &n); err != nil {
		return n, fmt.Errorf("%s: %w", path, err)
	}
	if n.DriverVersion == "" || len(n.GPUs) == 0 {
		return n, fmt.Errorf("%s: driverVersion and gpus are required", path)
	}
	if n.CudaDriverVersion == 0 {
		n.CudaDriverVersion = 13000
	}
	return n, nil
}

// newMockNVML builds go-nvml's mock server (A100-SXM4-40GB devices: their MIG profile tables) with the node's
// UUIDs, minors and bus ids, and fills in what the mock leaves unimplemented, as the toolkit's tests do
// (pkg/nvcdi/lib-nvml_test.go's mockOverrides): MIG device handles, GPU and compute instances looked up by id.
func newMockNVML(n node) (*server.Server, error) {
	s, err := server.New(
		server.WithGPUs(gpus.Multiple(len(n.GPUs), gpus.A100_SXM4_40GB)...),
		server.WithDriverVersion(n.DriverVersion),
		server.WithNVMLVersion("13."+n.DriverVersion),
		server.WithCUDADriverVersion(n.CudaDriverVersion),
	)
	if err != nil {
		return nil, err
	}
	for i, spec := range n.GPUs {
		d := s.Devices[i].(*server.Device)
		d.UUID, d.Minor, d.PciBusID = spec.UUID, spec.Minor, spec.PciBusID
		if err := completeDevice(s, d, spec.MIGs); err != nil {
			return nil, fmt.Errorf("GPU %s: %w", spec.UUID, err)
		}
	}
	return s, nil
}

func completeDevice(s *server.Server, d *server.Device, migs []mig) error {
	d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		info := nvml.PciInfo{PciDeviceId: d.Config.PciDeviceId}
		for i, c := range []byte(d.PciBusID) {
			info.BusId[i] = int8(c)
		}
		return info, nvml.SUCCESS
	}
	handles := make([]nvml.Device, 0, len(migs))
	for j, m := range migs {
		handle, err := newMigDevice(s, d, m, j)
		if err != nil {
			return err
		}
		handles = append(handles, handle)
	}
	if len(handles) > 0 {
		d.MigMode = nvml.DEVICE_MIG_ENABLE
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return len(handles), nvml.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(j int) (nvml.Device, nvml.Return) {
		if j < 0 || j >= len(handles) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return handles[j], nvml.SUCCESS
	}
	d.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		for gi := range d.GpuInstances {
			if int(gi.Info.Id) == id {
				return gi, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	return nil
}

// newMigDevice creates the MIG device's GPU and compute instances on the mock GPU, with the ids the node gives,
// and its NVML handle.
func newMigDevice(s *server.Server, parent *server.Device, m mig, index int) (nvml.Device, error) {
	giProfile, ok := profileWithSlices(parent, m.Slices)
	if !ok {
		return nil, fmt.Errorf("MIG %s: no GPU instance profile of %d slices", m.UUID, m.Slices)
	}
	created, ret := parent.CreateGpuInstance(&giProfile)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("MIG %s: GPU instance: %v", m.UUID, ret)
	}
	gi := created.(*server.GpuInstance)
	gi.Info.Id = uint32(m.GI)
	ciProfile, ok := computeProfileWithSlices(gi, m.Slices)
	if !ok {
		return nil, fmt.Errorf("MIG %s: no compute instance profile of %d slices", m.UUID, m.Slices)
	}
	createdCI, ret := gi.CreateComputeInstance(&ciProfile)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("MIG %s: compute instance: %v", m.UUID, ret)
	}
	ci := createdCI.(*server.ComputeInstance)
	ci.Info.Id = uint32(m.CI)
	gi.GetComputeInstanceByIdFunc = func(id int) (nvml.ComputeInstance, nvml.Return) {
		if id == m.CI {
			return ci, nvml.SUCCESS
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	handle := &mocknvml.Device{
		IsMigDeviceHandleFunc:                  func() (bool, nvml.Return) { return true, nvml.SUCCESS },
		GetUUIDFunc:                            func() (string, nvml.Return) { return m.UUID, nvml.SUCCESS },
		GetDeviceHandleFromMigDeviceHandleFunc: func() (nvml.Device, nvml.Return) { return parent, nvml.SUCCESS },
		GetGpuInstanceIdFunc:                   func() (int, nvml.Return) { return m.GI, nvml.SUCCESS },
		GetComputeInstanceIdFunc:               func() (int, nvml.Return) { return m.CI, nvml.SUCCESS },
		GetIndexFunc:                           func() (int, nvml.Return) { return index, nvml.SUCCESS },
		GetAttributesFunc: func() (nvml.DeviceAttributes, nvml.Return) {
			return nvml.DeviceAttributes{MemorySizeMB: giProfile.MemorySizeMB}, nvml.SUCCESS
		},
	}
	byUUID := s.DeviceGetHandleByUUIDFunc
	s.DeviceGetHandleByUUIDFunc = func(uuid string) (nvml.Device, nvml.Return) {
		if uuid == m.UUID {
			return handle, nvml.SUCCESS
		}
		return byUUID(uuid)
	}
	return handle, nil
}

func profileWithSlices(d *server.Device, slices int) (nvml.GpuInstanceProfileInfo, bool) {
	for i := 0; i < nvml.GPU_INSTANCE_PROFILE_COUNT; i++ {
		info, ret := d.GetGpuInstanceProfileInfo(i)
		if ret == nvml.SUCCESS && int(info.SliceCount) == slices {
			return info, true
		}
	}
	return nvml.GpuInstanceProfileInfo{}, false
}

func computeProfileWithSlices(gi *server.GpuInstance, slices int) (nvml.ComputeInstanceProfileInfo, bool) {
	for j := 0; j < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; j++ {
		info, ret := gi.GetComputeInstanceProfileInfo(j, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.SUCCESS && int(info.SliceCount) == slices {
			return info, true
		}
	}
	return nvml.ComputeInstanceProfileInfo{}, false
}
