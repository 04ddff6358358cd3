# SPDX-License-Identifier: BSD-3-Clause
"""chorus_torch.__version__ is the version written in include/chorus/version.hpp, whichever way the
package was built (CMake's build tree, `cmake --install`, or `pip install ./python`); an installed
distribution's metadata says the same."""

import importlib.metadata
import re
from pathlib import Path

import chorus_torch

VERSION_HPP = Path(__file__).resolve().parents[2] / "include" / "chorus" / "version.hpp"


def header_version():
    text = VERSION_HPP.read_text()
    return ".".join(
        re.search(rf"^#define CHORUS_VERSION_{p} +([0-9]+) *$", text, re.M).group(1) for p in ("MAJOR", "MINOR", "PATCH"))


def test_version_matches_header():
    assert chorus_torch.__version__ == header_version(), (chorus_torch.__file__, VERSION_HPP)
    assert "__version__" in chorus_torch.__all__


def test_distribution_metadata():
    """Where chorus_torch was installed by pip, its metadata carries the same version; a build tree
    on PYTHONPATH has no metadata of its own (only an installed copy elsewhere could, so it is only
    compared when the imported package is the one pip installed)."""
    try:
        dist = importlib.metadata.distribution("chorus_torch")
    except importlib.metadata.PackageNotFoundError:
        return
    imported = Path(chorus_torch.__file__).resolve()
    installed = {Path(dist.locate_file(f)).resolve() for f in dist.files or ()}
    if imported in installed:
        assert dist.version == chorus_torch.__version__
