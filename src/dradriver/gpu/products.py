"""Facts about NVIDIA GPU products that the driver relies on, and that the simulator is built from.

Production code (the NVML adapter, slice building, health) and the simulated node read the same facts here, so
the two cannot disagree: NVML's architecture numbers, MIG geometry (memory and compute slices per GPU), which
architectures register with an NVLink fabric or change MIG mode without a reset, the XID classes of NVIDIA's XID
catalog, and the products themselves (``data/products.yaml``: names as NVML reports them, memory, SMs, MIG
profiles), validated on load.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from dradriver.gpu.models import MigProfile, Placement

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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class MigProfileSpec(_Strict):
    name: str
    id: int = Field(ge=0)
    enum: int = Field(ge=0, description="NVML_GPU_INSTANCE_PROFILE_* value used to look the profile up")
    slices: int = Field(ge=1, le=8)
    memory_slices: int = Field(alias="memorySlices", ge=1, le=8)
    max: int = Field(ge=1)
    memory_mib: int = Field(alias="memoryMiB", gt=0)
    sm: int = Field(gt=0)
    ce: int = Field(ge=0)
    dec: int = Field(ge=0)
    enc: int = Field(ge=0)
    jpeg: int = Field(ge=0)
    ofa: int = Field(ge=0)
    starts: tuple[int, ...]

    @model_validator(mode="after")
    def _placements_fit(self) -> MigProfileSpec:
        for start in self.starts:
            if start < 0 or start + self.memory_slices > MEMORY_SLICES_PER_GPU:
                raise ValueError(
                    f"placement start {start} with {self.memory_slices} memory slices does not fit "
                    f"in {MEMORY_SLICES_PER_GPU} slices"
                )
        return self

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


class ProductSpec(_Strict):
    architecture: str
    compute_capability: str = Field(alias="computeCapability", pattern=r"^\d+\.\d+$")
    memory_mib: int = Field(alias="memoryMiB", gt=0)
    multiprocessors: int = Field(gt=0)
    pci_device_id: int = Field(alias="pciDeviceId", ge=0)
    nvlinks: int = Field(ge=0, le=36)
    mig_profiles: tuple[MigProfileSpec, ...] = Field(default=(), alias="migProfiles")

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    def profile_named(self, name: str) -> MigProfileSpec | None:
        return next((p for p in self.mig_profiles if p.name == name), None)


@cache
def load_products() -> dict[str, ProductSpec]:
    """Every product we know, keyed by its NVML name (the simulator can build a node of any of them)."""
    text = resources.files("dradriver.gpu").joinpath("data/products.yaml").read_text()
    # Our own file: libyaml's safe loader where PyYAML has it, since the pure-Python one spent 20 times as long
    # (about 90 ms against 4 on the loaded benchmark machine) of every simulated node's start-up.
    raw = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return {name: ProductSpec.model_validate(spec) for name, spec in raw.items()}
