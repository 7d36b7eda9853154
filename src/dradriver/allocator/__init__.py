"""A pure simulation of the Kubernetes scheduler's DRA allocator (structured parameters).

from dradriver.allocator import allocate, Unsatisfiable, AllocationError
allocation = allocate(claim, slices=[...], classes=[...], allocated=[...], node="node-a")
"""

from dradriver.allocator.allocator import ShareIDs, allocate, explain_claim, stable_share_id
from dradriver.allocator.errors import AllocationError, Unsatisfiable
from dradriver.allocator.explain import ClaimReport, RequestReport, Stage

__all__ = [
    "AllocationError",
    "ClaimReport",
    "RequestReport",
    "ShareIDs",
    "Stage",
    "Unsatisfiable",
    "allocate",
    "explain_claim",
    "stable_share_id",
]
