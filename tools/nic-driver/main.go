// A DRA kubelet plugin for network interfaces, the second driver of the topology recipe (docs/recipes/topology.md).
//
// It discovers NICs the way dranet (github.com/google/dranet) does, from sysfs: every entry of <sysfs>/class/net
// whose link resolves under devices/pci…/<bus id>/net/<name> is a PCI NIC, and its standard attributes
// resource.kubernetes.io/pcieRoot, numaNode and pciBusID come from upstream's helpers in
// k8s.io/dynamic-resource-allocation/deviceattribute (the ones dranet calls), pointed at --sysfs-root. On a real
// node that is /sys; in the suite it is a stand-in tree whose NICs sit under our simulated GPUs' PCIe roots.
// Registration, ResourceSlices and the kubelet's gRPC calls are upstream's kubeletplugin helper. Prepare hands
// each container one variable per NIC (NIC_<INTERFACE>=<bus id>) through a CDI spec. Built by scripts/build-nic-driver.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

type options struct {
	driverName, nodeName, kubeconfig, sysfsRoot, registryDir, pluginDir, cdiDir string
}

var busID = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$`)

func main() {
	var o options
	klog.InitFlags(nil)
	flag.StringVar(&o.driverName, "driver-name", "nic.example.com", "the DRA driver name")
	flag.StringVar(&o.nodeName, "node-name", "", "the Node whose NICs this plugin publishes")
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the API server")
	flag.StringVar(&o.sysfsRoot, "sysfs-root", "/sys", "where sysfs is (a stand-in tree in tests)")
	flag.StringVar(&o.registryDir, "registry-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugin registry directory")
	flag.StringVar(&o.pluginDir, "plugin-dir", "", "this plugin's directory for its DRA socket (default: the kubelet's plugins/<driver>)")
	flag.StringVar(&o.cdiDir, "cdi-dir", "/var/run/cdi", "where CDI specs are written for the container runtime")
	flag.Parse()
	if err := run(o); err != nil {
		klog.Fatalf("nic-driver: %v", err)
	}
}

func run(o options) error {
	if o.nodeName == "" {
		return fmt.Errorf("--node-name is required")
	}
	devices, err := discover(o.sysfsRoot)
	if err != nil {
		return err
	}
	config, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if o.pluginDir == "" {
		o.pluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, o.driverName)
	}
	if err := os.MkdirAll(o.pluginDir, 0o750); err != nil {
		return err
	}
	plugin := &nicPlugin{driverName: o.driverName, cdiDir: o.cdiDir, env: map[string]string{}}
	for _, device := range devices {
		// NIC_<INTERFACE>=<PCI bus id>: what the container is told about each NIC it gets.
		ifName := strings.ToUpper(*device.Attributes["interfaceName"].StringValue)
		bus := *device.Attributes[deviceattribute.StandardDeviceAttributePCIBusID].StringValue
		plugin.env[device.Name] = "NIC_" + strings.NewReplacer("-", "_", ".", "_").Replace(ifName) + "=" + bus
	}
	helper, err := kubeletplugin.Start(ctx, plugin,
		kubeletplugin.DriverName(o.driverName), kubeletplugin.NodeName(o.nodeName), kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(o.registryDir), kubeletplugin.PluginDataDirectoryPath(o.pluginDir),
		kubeletplugin.HealthService(false))
	if err != nil {
		return err
	}
	defer helper.Stop()
	pool := resourceslice.Pool{Slices: []resourceslice.Slice{{Devices: devices}}}
	resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{o.nodeName: pool}}
	if err := helper.PublishResources(ctx, resources); err != nil {
		return err
	}
	klog.Infof("publishing %d NICs for node %s as %s", len(devices), o.nodeName, o.driverName)
	announceRegistration(ctx, helper)
	<-ctx.Done()
	return nil
}

// announceRegistration logs once the kubelet has registered the plugin (what a test waits for before pods).
func announceRegistration(ctx context.Context, helper *kubeletplugin.Helper) {
	ticker := time.NewTicker(200 * time.Millisecond)
	defer ticker.Stop()
	for {
		if status := helper.RegistrationStatus(); status != nil && status.PluginRegistered {
			klog.Info("kubelet registered the plugin")
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// discover returns one device per PCI network interface under sysfsRoot/class/net, sorted by name, each with the
// standard pcieRoot, numaNode (where sysfs knows it) and pciBusID attributes.
func discover(sysfsRoot string) ([]resourceapi.Device, error) {
	entries, err := os.ReadDir(filepath.Join(sysfsRoot, "class", "net"))
	if err != nil {
		return nil, err
	}
	var devices []resourceapi.Device
	for _, entry := range entries {
		target, err := os.Readlink(filepath.Join(sysfsRoot, "class", "net", entry.Name()))
		if err != nil {
			continue
		}
		parts := strings.Split(filepath.ToSlash(target), "/")
		// .../devices/pci0000:80/0000:80:01.0/0000:8c:00.0/net/<name>: the bus id is the component before "net".
		if len(parts) < 3 || parts[len(parts)-2] != "net" || !busID.MatchString(parts[len(parts)-3]) {
			klog.Infof("skipping %s: not a PCI network interface (%s)", entry.Name(), target)
			continue
		}
		device, err := pciDevice(sysfsRoot, entry.Name(), parts[len(parts)-3])
		if err != nil {
			return nil, err
		}
		devices = append(devices, device)
	}
	sort.Slice(devices, func(i, j int) bool { return devices[i].Name < devices[j].Name })
	return devices, nil
}

func pciDevice(sysfsRoot, ifName, bus string) (resourceapi.Device, error) {
	root := deviceattribute.WithFSFromRoot(sysfsRoot)
	attributes := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"interfaceName": {StringValue: &ifName},
	}
	pcieRoot, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(bus, root)
	if err != nil {
		return resourceapi.Device{}, err
	}
	busAttribute, err := deviceattribute.GetPCIBusIDAttribute(bus)
	if err != nil {
		return resourceapi.Device{}, err
	}
	for _, attribute := range []deviceattribute.DeviceAttribute{pcieRoot, busAttribute} {
		attributes[attribute.Name] = attribute.Value
	}
	// A device without NUMA affinity (numa_node -1) has no numaNode: the helper says so with an error.
	if numa, err := deviceattribute.GetNUMANodeAttributeByPCIBusID(bus, deviceattribute.ScalarAttribute, root); err == nil {
		attributes[numa.Name] = numa.Value
	} else {
		klog.Infof("%s (%s): no numaNode: %v", ifName, bus, err)
	}
	name := strings.NewReplacer(":", "-", ".", "-").Replace("nic-" + bus)
	return resourceapi.Device{Name: name, Attributes: attributes}, nil
}

type nicPlugin struct {
	driverName, cdiDir string
	env                map[string]string // device name -> the variable its containers get
}

func (p *nicPlugin) specPath(claim types.UID) string {
	return filepath.Join(p.cdiDir, fmt.Sprintf("%s-%s.json", p.driverName, claim))
}

// PrepareResourceClaims writes one CDI spec per claim: each of this driver's devices becomes a CDI device that
// sets NIC_<INTERFACE>=<PCI bus id> in the container.
func (p *nicPlugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	results := map[types.UID]kubeletplugin.PrepareResult{}
	for _, claim := range claims {
		results[claim.UID] = p.prepare(claim)
	}
	return results, nil
}

func (p *nicPlugin) prepare(claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	if claim.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)}
	}
	kind := p.driverName + "/nic"
	var cdiDevices []map[string]any
	var prepared []kubeletplugin.Device
	for _, result := range claim.Status.Allocation.Devices.Results {
		if result.Driver != p.driverName {
			continue
		}
		name := fmt.Sprintf("%s-%s", claim.UID, result.Device)
		edits := map[string]any{"env": []string{p.env[result.Device]}}
		cdiDevices = append(cdiDevices, map[string]any{"name": name, "containerEdits": edits})
		prepared = append(prepared, kubeletplugin.Device{
			Requests: []string{result.Request}, PoolName: result.Pool, DeviceName: result.Device,
			CDIDeviceIDs: []string{kind + "=" + name},
		})
	}
	spec, err := json.Marshal(map[string]any{"cdiVersion": "0.6.0", "kind": kind, "devices": cdiDevices})
	if err == nil {
		err = writeAtomically(p.specPath(claim.UID), spec)
	}
	if err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	return kubeletplugin.PrepareResult{Devices: prepared}
}

// UnprepareResourceClaims removes each claim's CDI spec; a spec already gone is no error.
func (p *nicPlugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	results := map[types.UID]error{}
	for _, claim := range claims {
		if err := os.Remove(p.specPath(claim.UID)); err != nil && !os.IsNotExist(err) {
			results[claim.UID] = err
		} else {
			results[claim.UID] = nil
		}
	}
	return results, nil
}

func (p *nicPlugin) HandleError(_ context.Context, err error, msg string) {
	klog.Errorf("%s: %v", msg, err)
}

// WatchHealthStatus is never called: the health service is off (these NICs report no health).
func (p *nicPlugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func writeAtomically(path string, data []byte) error {
	temporary := path + ".tmp"
	if err := os.WriteFile(temporary, data, 0o644); err != nil {
		return err
	}
	return os.Rename(temporary, path)
}
