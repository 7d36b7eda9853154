"""Every Kubernetes name and value rule, once: a leaf that imports nothing of ours but ``inputs`` and ``quantity``.

- :mod:`dradriver.validation.names`: DNS label and subdomain, C identifier, qualified (attribute/capacity) name,
  label key, semver; quantity format re-exported from :mod:`dradriver.quantity`.
- :mod:`dradriver.validation.objects`: ResourceClaims, templates and DeviceClasses as the API server checks
  them, and the types of the ResourceSlice fields dradriver reads.
- :mod:`dradriver.validation.slices`: the API server's ResourceSlice rules, by release (the publisher, the
  in-memory cluster and ``explain`` check slices with them).

Claim, class and slice checks, flag checks and the kubelet plugin's name checks all use :mod:`.names`, so no two
copies of a rule can disagree.
"""

from dradriver.validation.names import (
    DNS_LABEL_HELP,
    DNS_SUBDOMAIN_HELP,
    is_c_identifier,
    is_dns_label,
    is_dns_subdomain,
    is_label_key,
    is_label_value,
    is_qualified_name,
    is_quantity,
    is_semver,
)
from dradriver.validation.objects import (
    MAX_CEL_LENGTH,
    default_namespace,
    validate_claim,
    validate_class,
    validate_metadata,
    validate_slice_fields,
)

__all__ = [
    "DNS_LABEL_HELP",
    "DNS_SUBDOMAIN_HELP",
    "MAX_CEL_LENGTH",
    "default_namespace",
    "is_c_identifier",
    "is_dns_label",
    "is_dns_subdomain",
    "is_label_key",
    "is_label_value",
    "is_qualified_name",
    "is_quantity",
    "is_semver",
    "validate_claim",
    "validate_class",
    "validate_metadata",
    "validate_slice_fields",
]
