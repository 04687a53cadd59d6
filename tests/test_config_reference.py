"""The guide's config reference is rendered from the pydantic models: every key, its default and its description."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from r1trade.config_reference import BEGIN, END, reference_markdown, rewrite_guide, undescribed_keys

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"


class Inner(BaseModel):
    """An inner section.

    Only the first paragraph is the summary."""

    when: datetime = Field(datetime(2024, 1, 1), description="a time")
    sizes: list[float] = Field([0.0, 1.5], description="one | two")


class Outer(BaseModel):
    """The top."""

    mode: Literal["a", "b"] = Field("a", description="a: this; b: that")
    limit: int | None = Field(None, description="unset: no limit")
    quiet: bool = Field(False, description="say less")
    params: dict[str, int] = Field(default_factory=lambda: {"fast": 10}, description="overrides")
    inner: Inner = Inner()
    bare: int = 3


def test_a_model_renders_as_worked_out_by_hand() -> None:
    assert reference_markdown(Outer) == "\n".join([
        "#### Top level", "", "The top.", "",
        "| key | default | what it does |", "|---|---|---|",
        "| `mode` | `a` | `a` \\| `b`: a: this; b: that |",
        "| `limit` | `null` | unset: no limit |",
        "| `quiet` | `false` | say less |",
        "| `params` | `{fast: 10}` | overrides |",
        "| `bare` | `3` |  |",
        "",
        "#### `inner`", "", "An inner section.", "",
        "| key | default | what it does |", "|---|---|---|",
        "| `when` | `2024-01-01 00:00:00` | a time |",
        "| `sizes` | `[0.0, 1.5]` | one \\| two |",
        "",
    ])
    assert undescribed_keys(Outer) == ["bare"]


def test_the_guide_holds_the_reference_of_every_key_as_the_code_has_it() -> None:
    assert undescribed_keys() == []
    text = GUIDE.read_text(encoding="utf-8")
    assert f"{BEGIN}\n\n{reference_markdown()}\n{END}" in text, (
        "docs/guide.md's config reference differs from src/r1trade/config.py: run "
        "`python -m r1trade.config_reference docs/guide.md`"
    )


def test_rewriting_replaces_only_the_block_between_the_markers(tmp_path: Path) -> None:
    guide = tmp_path / "guide.md"
    guide.write_text(f"# Guide\n\n{BEGIN}\nold tables\n{END}\n\n## Next\n", encoding="utf-8")
    assert rewrite_guide(guide, Outer)
    assert guide.read_text(encoding="utf-8") == (
        f"# Guide\n\n{BEGIN}\n\n{reference_markdown(Outer)}\n{END}\n\n## Next\n"
    )
    assert not rewrite_guide(guide, Outer)  # already current


def test_a_guide_without_the_markers_gets_a_one_line_error_and_is_left_alone(tmp_path: Path) -> None:
    guide = tmp_path / "guide.md"
    guide.write_text("# Guide\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "r1trade.config_reference", str(guide)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"error: {guide} lacks the two comments that mark the config "
                                                "reference's place"]
    assert guide.read_text(encoding="utf-8") == "# Guide\n"
