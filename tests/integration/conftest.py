"""Integration tests run on both data planes: Open vSwitch and Linux kernel routers."""

import pytest

DATAPLANES = ("ovs", "linux")


@pytest.fixture(params=DATAPLANES)
def dataplane(request):
    """The data plane a test's testbed uses (``Testbed(..., dataplane=...)`` or
    ``--set dataplane=...``): every test that takes it runs once per data plane."""
    return request.param
