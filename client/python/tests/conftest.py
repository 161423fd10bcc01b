"""Fixtures of the topos client tests.

The tests in test_client.py talk to a real toposd whose address is
$TOPOS_SERVER ("HOST:PORT"); without it they are skipped.  The ones in
test_tensors.py need no daemon.  tests/daemon/test_python.c runs them
all against a daemon it starts, with the package installed in a fresh
virtual environment.
"""
import os

import pytest

import topos

SKIP_WHY = ("TOPOS_SERVER is not set: these tests need a running toposd, "
            "e.g. build/bin/toposd --listen 127.0.0.1:0 --http off --store "
            "/tmp/t/topos.db, then TOPOS_SERVER=127.0.0.1:PORT")


def pytest_report_header(config):
    return "topos %s from %s; TOPOS_SERVER=%s" % (
        topos.__version__, os.path.dirname(topos.__file__),
        os.environ.get("TOPOS_SERVER", "(unset)"))


@pytest.fixture(scope="session")
def address():
    a = os.environ.get("TOPOS_SERVER")
    if not a:
        pytest.skip(SKIP_WHY)
    return a


@pytest.fixture(scope="session")
def client(address):
    with topos.Client(address, timeout=60) as c:
        yield c


def gd_spec():
    """The gradient-descent spec, w a parameter, x and y inputs, loss =
    (w*x - y)^2 in f64: the nodes of tests/python/test_client.py."""
    s = topos.Spec("f64")
    w, x, y = s.param(0.0, "w"), s.input(0.0, "x"), s.input(0.0, "y")
    r = w * x - y
    s.name(r * r, "loss")
    return s


@pytest.fixture(scope="session")
def gd(client):
    """The gradient-descent spec, recorded."""
    return client.record(gd_spec())
