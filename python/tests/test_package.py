"""The package as pip builds and installs it: what its metadata says, and
that building it leaves its source tree as it was. Builds a wheel with pip,
which fetches the build backend from PyPI as ``pip install ./python``
does."""

import importlib.metadata
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import hipobj

SOURCE = pathlib.Path(__file__).resolve().parents[1]


def listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_the_version_is_the_one_the_package_was_installed_as():
    assert hipobj.__version__ == importlib.metadata.version("hipobj")
    # The library's, as numbers and as its string.
    assert hipobj.library_version() == tuple(int(n) for n in hipobj.version().split("."))


def test_boto3_comes_with_the_package_and_numpy_as_an_extra():
    requires = importlib.metadata.requires("hipobj") or []
    plain = [r for r in requires if "extra ==" not in r]
    assert any(r.startswith("boto3") for r in plain), requires
    assert any(r.startswith("numpy") and 'extra == "numpy"' in r for r in requires), requires


def test_building_the_package_writes_nothing_into_its_source_tree(tmp_path):
    source = tmp_path / "python"
    shutil.copytree(SOURCE, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    before = listing(source)
    out = tmp_path / "wheels"
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(source)],
        check=True,
        env=env,
    )
    assert listing(source) == before, "the build wrote into the source tree"
    (wheel,) = out.glob("*.whl")
    assert wheel.name.startswith(f"hipobj-{hipobj.__version__}-")
    names = zipfile.ZipFile(wheel).namelist()
    assert "hipobj/py.typed" in names and "hipobj/_session.py" in names
    assert not any(name.startswith("tests/") for name in names)
