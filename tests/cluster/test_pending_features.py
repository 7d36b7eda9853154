"""Places for the cluster tests of features other branches are building, skipped until those land on main.

Each skip names what must exist first; the test body says what it will check, so filling it in is mechanical.
"""

from __future__ import annotations
