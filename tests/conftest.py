"""Shared test configuration: the ``require_root`` marker (as in ipmininet)."""

import os

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "require_root: needs root, Open vSwitch and Mininet")


def pytest_collection_modifyitems(config, items):
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root (run `sudo make test`)")
    for item in items:
        if "require_root" in item.keywords:
            item.add_marker(skip)
