"""A pure-Python evaluator for Kubernetes DRA device selectors (CEL), with the scheduler's semantics.

from dradriver.cel import compile_selector, CelCompileError, CelEvaluationError
sel = compile_selector('device.attributes["gpu.dradriver.dev"].type == "gpu"')
sel.matches(device, driver="gpu.dradriver.dev")
"""

from dradriver.cel.errors import CelCompileError, CelError, CelEvaluationError
from dradriver.cel.selector import Selector, compile_selector
from dradriver.cel.semver import Semver
from dradriver.quantity import Quantity

__all__ = [
    "CelCompileError",
    "CelError",
    "CelEvaluationError",
    "Quantity",
    "Selector",
    "Semver",
    "compile_selector",
]
