"""Fixtures the test trees share (tests/ and e2e/): one real control plane and one real node per test process."""

pytest_plugins = ["support.cluster_fixtures"]
