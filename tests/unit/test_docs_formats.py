"""docs/deploy.md states the newest command format this release applies: it must be the code's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from broker.core.formats import CODE_FORMAT

pytestmark = pytest.mark.unit

DEPLOY = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"


def test_deploy_md_names_the_code_format() -> None:
    text = " ".join(DEPLOY.read_text().split())
    stated = re.search(r"This release applies formats up to (\d+) .*?raises its format to (\d+) ", text)
    assert stated is not None, "docs/deploy.md no longer says which command format this release applies"
    assert (int(stated.group(1)), int(stated.group(2))) == (CODE_FORMAT, CODE_FORMAT)
