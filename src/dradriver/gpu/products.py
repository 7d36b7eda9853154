"""Facts about NVIDIA GPU products that the driver relies on, and that the simulator is built from.

Production code (the NVML adapter, slice building, health) and the simulated node read the same facts here, so
the two cannot disagree: NVML's architecture numbers, MIG geometry (memory and compute slices per GPU), which
architectures register with an NVLink fabric or change MIG mode without a reset, the XID classes of NVIDIA's XID
catalog, and the products themselves (``data/products.yaml``: names as NVML reports them, memory, SMs, MIG
profiles), validated on load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml

from dradriver.gpu.models import MigProfile, Placement
from dradriver.inputs import Fields

# A MIG-capable GPU has 8 memory slices and 7 compute slices; profiles and placements are counted in them.
MEMORY_SLICES_PER_GPU = 8
COMPUTE_SLICES_PER_GPU = 7

# nvmlDeviceGetArchitecture values → architecture names (as go-nvlib spells them).
ARCHITECTURE_NAMES: dict[int, str] = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}
ARCHITECTURE_NUMBERS: dict[str, int] = {name: number for number, name in ARCHITECTURE_NAMES.items()}
# Architectures whose GPUs report NVLink fabric registration (nvmlDeviceGetGpuFabricInfoV): Hopper and newer.
FABRIC_ARCHITECTURES = frozenset({"Hopper", "Blackwell", "Rubin"})
# Architectures that switch MIG mode without a GPU reset (Ampere leaves the change pending until one).
RESETLESS_MIG_ARCHITECTURES = frozenset({"Hopper", "Blackwell"})

# XIDs that an application causes and that leave the GPU fine (NVIDIA's device plugin and DRA driver skip the
# same six).
APPLICATION_XIDS: dict[int, str] = {
    13: "graphics engine exception: the application ran an illegal instruction or went out of bounds",
    31: "GPU memory page fault: the application touched an address it does not own",
    43: "GPU stopped processing: the application's channel was reset after its own error",
    45: "preemptive cleanup: the driver tore down a process that was ending or killed",
    68: "video processor (NVDEC/NVENC) exception: bad input or misuse by the application",
    109: "context-switch timeout: the application's context did not yield (usually follows its own error)",
}
# XIDs where the hardware or its firmware is at fault (NVIDIA's XID catalog asks for a GPU reset or more for each).
HARDWARE_XIDS: dict[int, str] = {
    48: "double-bit ECC error: GPU memory is corrupt",
    62: "internal micro-controller halt",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error: the GPU needs a reset to clear it",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP firmware error",
    140: "unrecovered ECC error",
}
# XIDs after which the driver asks for a GPU reset (NVML_GPU_RECOVERY_ACTION_GPU_RESET), as NVIDIA's XID catalog
# does for them; the action reads "none" again once the GPU is reset.
RESET_XIDS = frozenset({48, 62, 63, 64, 74, 94, 95, 119, 120, 140})
# XIDs that mean the GPU left the PCIe bus: NVML then answers GPU_IS_LOST for it until a reset brings it back.
LOST_XIDS = frozenset({79})
# XIDs the driver logs for an uncorrectable ECC error, which the GPU's uncorrectable ECC counters also count: 48
# (double-bit), 94 (contained) and 95 (uncontained).
ECC_XIDS = frozenset({48, 94, 95})


_COMPUTE_CAPABILITY = re.compile(r"^\d+\.\d+$")


@dataclass(frozen=True)
class MigProfileSpec:
    """One MIG profile of a product as ``data/products.yaml`` lists it (``memorySlices``, ``memoryMiB``…)."""

    name: str
    id: int
    enum: int  # NVML_GPU_INSTANCE_PROFILE_* value used to look the profile up
    slices: int
    memory_slices: int
    max: int
    memory_mib: int
    sm: int
    ce: int
    dec: int
    enc: int
    jpeg: int
    ofa: int
    starts: tuple[int, ...]

    @classmethod
    def read(cls, raw: object, where: str) -> MigProfileSpec:
        fields = Fields(raw, where)
        starts = tuple(int(_start(value, at)) for at, value in fields.items("starts"))
        spec = cls(
            name=fields.string("name"),
            id=fields.integer("id", ge=0),
            enum=fields.integer("enum", ge=0),
            slices=fields.integer("slices", ge=1, le=8),
            memory_slices=fields.integer("memorySlices", ge=1, le=8),
            max=fields.integer("max", ge=1),
            memory_mib=fields.integer("memoryMiB", gt=0),
            sm=fields.integer("sm", gt=0),
            ce=fields.integer("ce", ge=0),
            dec=fields.integer("dec", ge=0),
            enc=fields.integer("enc", ge=0),
            jpeg=fields.integer("jpeg", ge=0),
            ofa=fields.integer("ofa", ge=0),
            starts=starts,
        )
        fields.done()
        for start in spec.starts:
            if start < 0 or start + spec.memory_slices > MEMORY_SLICES_PER_GPU:
                raise ValueError(
                    f"{where}: placement start {start} with {spec.memory_slices} memory slices does not fit "
                    f"in {MEMORY_SLICES_PER_GPU} slices"
                )
        return spec

    def to_profile(self) -> MigProfile:
        return MigProfile(
            id=self.id,
            name=self.name,
            slice_count=self.slices,
            memory_slices=self.memory_slices,
            max_instances=self.max,
            memory_mib=self.memory_mib,
            multiprocessors=self.sm,
            copy_engines=self.ce,
            decoders=self.dec,
            encoders=self.enc,
            jpeg_engines=self.jpeg,
            ofa_engines=self.ofa,
            placements=tuple(Placement(start, self.memory_slices) for start in self.starts),
        )


def _start(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{where}: Input should be a valid integer")
    return value


@dataclass(frozen=True)
class ProductSpec:
    """One product of ``data/products.yaml``, keyed there by its NVML name."""

    architecture: str
    compute_capability: str
    memory_mib: int
    multiprocessors: int
    pci_device_id: int
    nvlinks: int
    mig_profiles: tuple[MigProfileSpec, ...] = ()

    @classmethod
    def read(cls, raw: object, where: str) -> ProductSpec:
        fields = Fields(raw, where)
        spec = cls(
            architecture=fields.string("architecture"),
            compute_capability=fields.string("computeCapability", pattern=_COMPUTE_CAPABILITY),
            memory_mib=fields.integer("memoryMiB", gt=0),
            multiprocessors=fields.integer("multiprocessors", gt=0),
            pci_device_id=fields.integer("pciDeviceId", ge=0),
            nvlinks=fields.integer("nvlinks", ge=0, le=36),
            mig_profiles=tuple(MigProfileSpec.read(value, at) for at, value in fields.items("migProfiles")),
        )
        fields.done()
        return spec

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    def profile_named(self, name: str) -> MigProfileSpec | None:
        return next((p for p in self.mig_profiles if p.name == name), None)


@cache
def load_products() -> dict[str, ProductSpec]:
    """Every product we know, keyed by its NVML name (the simulator can build a node of any of them).

    Checked by hand (:class:`~dradriver.inputs.Fields`), not by pydantic models: the NVML adapter reads this
    table in every node driver, and pydantic's machinery is about 10 MB of a driver's memory."""
    text = resources.files("dradriver.gpu").joinpath("data/products.yaml").read_text()
    # Our own file: libyaml's safe loader where PyYAML has it, since the pure-Python one spent 20 times as long
    # (about 90 ms against 4 on the loaded benchmark machine) of every simulated node's start-up.
    raw = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return {name: ProductSpec.read(spec, name) for name, spec in raw.items()}
