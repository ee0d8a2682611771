"""System tools some tests need, installed by `.ci/` on a fresh machine: missing locally, the test skips;
missing in CI (`CI=true`, set by .ci/run and GitHub), it fails, so a test never silently stops running there."""

from __future__ import annotations

import os
import shutil

import pytest


def require(tool: str, installer: str, why: str) -> str:
    found = shutil.which(tool)
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail(f"{tool} is missing: run `bash {installer}` first ({why})")
    pytest.skip(f"{tool} is not installed ({why}; bash {installer})")


def require_rsync() -> str:
    return require("rsync", ".ci/apt-install.sh rsync", "the copy off a stopped instance is rsync's, as `vastai copy` runs it")
