"""A pure simulation of the Kubernetes scheduler's DRA allocator (structured parameters).

from dradriver.allocator import allocate, Unsatisfiable, AllocationError
allocation = allocate(claim, slices=[...], classes=[...], allocated=[...], node="node-a")
"""

from dradriver.allocator.allocator import allocate, explain_claim
from dradriver.allocator.errors import AllocationError, Unsatisfiable
from dradriver.allocator.pools import SlicesByNode
from dradriver.allocator.report import ClaimReport, RequestReport, Stage
from dradriver.allocator.search import AllocationInputs, AllocationOptions, ShareIDs, stable_share_id

__all__ = [
    "AllocationError",
    "AllocationInputs",
    "AllocationOptions",
    "ClaimReport",
    "RequestReport",
    "ShareIDs",
    "SlicesByNode",
    "Stage",
    "Unsatisfiable",
    "allocate",
    "explain_claim",
    "stable_share_id",
]
