// Command nvcdi prints the CDI spec that NVIDIA's container toolkit generates (its pkg/nvcdi, called as NVIDIA's
// DRA driver calls it: mode nvml, nvsandboxutils off) for a driver root and a dev root, with go-nvml's mock
// devices standing in for NVML, as the toolkit's own tests do. The suite holds our specs against it
// (tests/integration/test_nvcdi_parity.py); scripts/build-nvcdi builds it.
//
//	nvcdi -node NODE.json -driver-root ROOT [-dev-root ROOT] [-hook PATH] [-bind SRC:DST]... [-device ID]...
//
// NODE.json describes the mock node: the driver version NVML reports, and each GPU with its UUID, minor number,
// PCI bus id and the MIG devices it holds (UUID, GPU-instance and compute-instance ids, slice count). Devices are
// named by UUID in the printed spec. -device picks devices by UUID (default: all).
//
// The toolkit reads some host files at fixed paths, outside any root: MIG capability minors in
// /proc/driver/nvidia-caps/mig-minors, DRM nodes of a PCI device in /sys/bus/pci/devices/<bus>/drm. -bind SRC:DST
// puts a stand-in there: the program runs again in a private mount namespace (root only) with SRC bound on DST.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	"github.com/sirupsen/logrus"
)

// inNamespace marks the run inside the private mount namespace, after the binds.
const inNamespace = "DRADRIVER_NVCDI_IN_NAMESPACE"

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

type options struct {
	node       string
	driverRoot string
	devRoot    string
	hook       string
	verbose    bool
	binds      listFlag
	devices    listFlag
}

func main() {
	o := parseFlags()
	if len(o.binds) > 0 && os.Getenv(inNamespace) == "" {
		os.Exit(runInNamespace())
	}
	if err := bindAll(o.binds); err != nil {
		fail(err)
	}
	if err := printSpec(o); err != nil {
		fail(err)
	}
}

func parseFlags() options {
	var o options
	flag.StringVar(&o.node, "node", "", "JSON file describing the mock node (required)")
	flag.StringVar(&o.driverRoot, "driver-root", "/", "the driver root, as the toolkit's --driver-root")
	flag.StringVar(&o.devRoot, "dev-root", "", "the root of /dev (default: the driver root)")
	flag.StringVar(&o.hook, "hook", "/usr/bin/nvidia-cdi-hook", "nvidia-cdi-hook's path, as the spec names it")
	flag.BoolVar(&o.verbose, "v", false, "log the toolkit's discovery (stderr)")
	flag.Var(&o.binds, "bind", "SRC:DST, a stand-in bound on a host path the toolkit reads (repeatable; root)")
	flag.Var(&o.devices, "device", "a device's UUID (repeatable; default: all)")
	flag.Parse()
	if o.node == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	return o
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "nvcdi: %v\n", err)
	os.Exit(1)
}

// runInNamespace runs this program again in a private mount namespace (Go makes / private there), where it binds
// the stand-ins; its exit status.
func runInNamespace() int {
	self, err := os.Executable()
	if err != nil {
		fail(err)
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Env = append(os.Environ(), inNamespace+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode()
		}
		fail(fmt.Errorf("a private mount namespace for -bind (root only): %w", err))
	}
	return 0
}

func bindAll(binds []string) error {
	for _, bind := range binds {
		src, dst, ok := strings.Cut(bind, ":")
		if !ok || src == "" || dst == "" {
			return fmt.Errorf("-bind %q: want SRC:DST", bind)
		}
		if err := syscall.Mount(src, dst, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
			return fmt.Errorf("-bind %s on %s: %w", src, dst, err)
		}
	}
	return nil
}

func printSpec(o options) error {
	node, err := readNode(o.node)
	if err != nil {
		return err
	}
	server, err := newMockNVML(node)
	if err != nil {
		return err
	}
	logger := logrus.New()
	logger.SetOutput(os.Stderr)
	logger.SetLevel(logrus.WarnLevel)
	if o.verbose {
		logger.SetLevel(logrus.DebugLevel)
	}
	uuidNamer, err := nvcdi.NewDeviceNamer(nvcdi.DeviceNameStrategyUUID)
	if err != nil {
		return err
	}
	lib, err := nvcdi.New(
		nvcdi.WithNvmlLib(server),
		nvcdi.WithDeviceLib(device.New(server)),
		nvcdi.WithDriverRoot(o.driverRoot),
		nvcdi.WithDevRoot(o.devRoot),
		nvcdi.WithLogger(logger),
		nvcdi.WithMode("nvml"),
		nvcdi.WithNVIDIACDIHookPath(o.hook),
		nvcdi.WithDeviceNamers(uuidNamer),
		nvcdi.WithFeatureFlags(nvcdi.FeatureDisableNvsandboxUtils),
	)
	if err != nil {
		return fmt.Errorf("nvcdi: %w", err)
	}
	spec, err := lib.GetSpec(o.devices...)
	if err != nil {
		return fmt.Errorf("nvcdi spec: %w", err)
	}
	out, err := json.MarshalIndent(spec.Raw(), "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Println(string(out))
	return err
}
