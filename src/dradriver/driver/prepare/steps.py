"""Every step kind a claim's prepare can record, registered in one place.

A step kind lives in the module that applies it, with its undo and drift check (:class:`StepKind`):
``cdi_step.py`` (CDI spec), ``mig.py`` (MIG mode, GPU instance, compute instance), ``sharing.py`` (compute mode,
time-slice, MPS daemon), ``vfio.py`` (VFIO passthrough's rebinding), ``partitions.py`` (Fabric Manager's NVSwitch
partition). A new step is one module that declares its
kinds, plus its line here. The transaction refuses a step that is not registered, and a record naming one this
version does not know is left for the version that wrote it.
"""

from __future__ import annotations

from collections.abc import Mapping

from dradriver.driver.prepare.cdi_step import CdiSpecStep
from dradriver.driver.prepare.mig import MigSteps
from dradriver.driver.prepare.partitions import FabricPartitions
from dradriver.driver.prepare.sharing import SharingSteps
from dradriver.driver.prepare.transaction import StepKind
from dradriver.driver.prepare.vfio import PassthroughSteps


def step_kinds(
    *,
    cdi: CdiSpecStep,
    sharing: SharingSteps,
    mig: MigSteps | None,
    vfio: PassthroughSteps | None = None,
    partitions: FabricPartitions | None = None,
) -> Mapping[str, StepKind]:
    """The step kinds of a driver, by name; the MIG ones only when it has GPU access, VFIO's with --passthrough,
    the fabric partition's with --fabric-manager-partitions."""
    kinds = [*cdi.kinds(), *sharing.kinds(), *(mig.kinds() if mig is not None else ())]
    kinds.extend(vfio.kinds() if vfio is not None else ())
    kinds.extend(partitions.kinds() if partitions is not None else ())
    return {kind.name: kind for kind in kinds}
