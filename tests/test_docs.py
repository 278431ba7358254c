"""The docs stay true to the code: docs/config.md is the schema's current reference, and the
docs cite only modules, files and link targets that exist (tools/gen_config_docs.py,
tools/check_docs.py)."""

from __future__ import annotations

import pathlib
import sys
from typing import Annotated

import pytest
from annotated_types import Ge

from tools import check_docs as check
from tools import gen_config_docs as gen

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_config_md_is_current() -> None:
    """docs/config.md equals what the generator writes from today's schema."""
    current = (ROOT / "docs" / "config.md").read_text()
    assert current == gen.render(), (
        f"docs/config.md is stale (the config schema changed); regenerate with: {gen.REGENERATE}")


def test_config_md_lists_every_key() -> None:
    """Every key the loader accepts (its own walk of the schema) has a row, with its default."""
    from sagc_jax.config import Config, config_keys

    text = gen.render()
    missing = [k for k in config_keys() if f"| `{k}` |" not in text]
    assert not missing, f"keys without a row in docs/config.md: {missing}"
    # null: resolved from sagc.straggler (0.6 tail_share, 0.1 group_ratio; issue 32)
    assert "| `sagc.delta` | `float \\| null` | `null` | > 0, < 1 |" in text
    assert "| `sagc.group_sizes` | `list[int]` | `[4, 8, 12, 16]` | each ≥ 2 |" in text
    assert "| `rewards[*].name` | `str` | `required` |" in text
    assert Config().algo.epsilon_high == 0.28 and "`epsilon_high` (TRL's" in text


def test_trl_map_names_real_keys() -> None:
    """The TRL map is the only per-key data: each of its keys must still be in the schema."""
    from sagc_jax.config import config_keys

    stale = sorted(set(gen.TRL_EQUIVALENTS) - set(config_keys()))
    assert not stale, f"tools/gen_config_docs.py TRL_EQUIVALENTS names unknown keys: {stale}"
    text = gen.render()
    assert "| `algo.clip_delta` |" in text and "| `delta` |" in text


def test_generator_follows_new_and_moved_fields() -> None:
    """A field added to a section, a new nested section and a list of sections all appear
    without touching the generator (nothing in it is written per key but the TRL map)."""
    from sagc_jax.config.base import Float, Int, Section, field

    class Inner(Section):
        """A new nested section."""

        rungs: tuple[Annotated[Int, Ge(3)], ...] = field((3, 6), "Rungs.")

    class Item(Section):
        """An item."""

        name: str = field(doc="Item name.")

    class Root(Section):
        """A toy root."""

        timeout_s: Float | None = field(None, "Seconds a call may take; None = no limit.", gt=0)
        inner: Inner = field(Inner(), "")
        items: tuple[Item, ...] = field((), "Items.")

    text = gen.render(Root)
    assert "| `timeout_s` | `float \\| null` | `null` | > 0 | Seconds a call may take;" in text
    assert "## inner" in text and "| `inner.rungs` | `list[int]` | `[3, 6]` | each ≥ 3 |" in text
    assert "## items[*]" in text and "| `items[*].name` | `str` | `required` |" in text
    assert gen.schema_keys(Root) == ["timeout_s", "items", "inner.rungs", "items[*].name"]


def test_docs_cite_only_what_exists() -> None:
    """README.md, benchmarks/*.md and docs/**/*.md (but docs/architecture.md, below):
    backticked module paths and names, repo files, named markdown files, module-table names and
    relative links all resolve."""
    arch = ROOT / "docs" / "architecture.md"
    found = check.problems([f for f in check.doc_files() if f != arch])
    assert not found, "broken references in the docs (python -m tools.check_docs):\n" + (
        "\n".join(found))


def test_architecture_md_true_to_the_code() -> None:
    """docs/architecture.md names only modules that exist, and its module table only classes
    and functions those modules define. (It is edited with the code it describes; a failure
    names the stale line to fix.)"""
    found = check.problems([ROOT / "docs" / "architecture.md"])
    assert not found, "docs/architecture.md is stale (python -m tools.check_docs):\n" + (
        "\n".join(found))


def test_table_symbol_check() -> None:
    """A module table row naming a class its module does not define, or a function that does
    not occur there, is caught; rows of words (not module paths) are not checked."""
    text = "\n".join([
        "| module | job |", "|---|---|",
        "| `train/state.py` | `RunState`, the one copy |",
        "| `sagc/controller.py` | `init_state(cfg)`, `SAGCPolicy` |",
        "| `rl/advantages.py`, `losses.py` | `NoSuchLoss`, `gone_fn(x)` |",
        "| `data` | `WhateverName` (a word in the first cell: not checked) |",
    ])
    assert check.bad_table_symbols(text, ROOT) == ["SAGCPolicy", "NoSuchLoss", "gone_fn"]


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("the step (`sagc_jax/train/nowhere.py`)", ["sagc_jax/train/nowhere.py"]),
        ("| `models/llama.py` | ok | `models/gone.py` |", ["models/gone.py"]),
        ("`rl/advantages.py`, `losses.py`, `nolosses.py`", ["nolosses.py"]),
        ("`sagc_jax.sagc.config`, `sagc_jax.config.Config`, `sagc_jax.nope`", ["sagc_jax.nope"]),
        ("`configs/tiny_cpu.yaml` and `configs/missing.yaml`", ["configs/missing.yaml"]),
        ("`runs/tiny_cpu/config.yaml` is a run output", []),
        ("```\nsagc_jax/fenced_away.py\n```\n`train/loop.py: train_one`", []),
    ],
)
def test_code_ref_check_catches_missing(text: str, bad: list[str]) -> None:
    assert check.bad_code_refs(text, ROOT) == bad


def test_link_and_name_checks_catch_missing(tmp_path: pathlib.Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("x")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "[ok](here.md#a) [gone](gone.md) [web](https://example.com) [anchor](#top) "
        "![img](pic.png)\nSee DESIGN.md and docs/here.md; results.md is written by a command.\n")
    found = check.problems([page], tmp_path)
    assert found == [
        "docs/page.md: broken link (gone.md)",
        "docs/page.md: broken link (pic.png)",
        "docs/page.md: names a missing file DESIGN.md",
    ]


def test_main_job_figures_are_regenerated_from_the_committed_run() -> None:
    """README's main-job row and docs/results/tiny_cpu.md's table are what
    `tools/main_job_figures.py` prints from the run's committed raw files."""
    import re
    import subprocess

    out = subprocess.run([sys.executable, "-m", "tools.main_job_figures", "docs/results/tiny_cpu"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
    assert out in (ROOT / "docs" / "results" / "tiny_cpu.md").read_text()
    reward = re.search(r"completions\) \| ([\d.]+) \| \*\*([\d.]+)\*\*", out).groups()
    held = re.search(r"accuracy \| ([\d.]+) \| \*\*([\d.]+)\*\*", out).groups()
    row = next(ln for ln in (ROOT / "README.md").read_text().splitlines()
               if ln.startswith("| main job"))
    assert f"reward {reward[0]} → **{reward[1]}**" in row, row
    assert f"held-out {held[0]} → **{held[1]}**" in row, row


@pytest.mark.parametrize("run,block,readme_row", [("tiny_cpu_tool", 25, "| tools"),
                                                   ("smollm2_tool", 6, "| tools, SmolLM2")])
def test_tool_job_figures_are_regenerated_from_the_committed_run(run, block, readme_row) -> None:
    """docs/results/<run>.md's tables and the README's tools row are what
    `tools/tool_job_figures.py` prints from the run's committed raw files."""
    import re
    import subprocess

    out = subprocess.run([sys.executable, "-m", "tools.tool_job_figures",
                          f"docs/results/{run}", "--block", str(block)],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
    page = (ROOT / "docs" / "results" / f"{run}.md").read_text()
    for table in out.split("\n\n"):
        assert table in page, table
    sft, after = re.search(r"SFT warm start \| ([\d.]+) .*\n\| after \d+ GRPO steps \| "
                           r"\*\*([\d.]+)\*\*", out).groups()
    row = next(ln for ln in (ROOT / "README.md").read_text().splitlines()
               if ln.startswith(readme_row + ","))
    assert f"held-out with the tool {sft} → **{after}**" in row, row


def test_gemma3_run_figures_are_regenerated_from_the_committed_run() -> None:
    """docs/results/gemma3/README.md's table is what `tools/main_job_figures.py` prints from
    the Gemma 3 270M run's committed raw files (and the superseded attempt's)."""
    import re
    import subprocess

    d = "docs/results/gemma3"
    page = (ROOT / d / "README.md").read_text()
    for run, extra in ((d, ["--paired", f"{d}/eval_paired_initial.json",
                            f"{d}/eval_paired_48.json"]), (f"{d}/attempt2_sft128", [])):
        out = subprocess.run([sys.executable, "-m", "tools.main_job_figures", run, "--untrained",
                              f"{d}/eval_untrained.json", "--lengths", *extra],
                             capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
        assert out in page, run
    # the README's row quotes the run's held-out figures
    before, after = re.search(r"held-out greedy accuracy \| ([\d.]+) \| \*\*([\d.]+)\*\*",
                              page).groups()
    row = next(ln for ln in (ROOT / "README.md").read_text().splitlines()
               if ln.startswith("| Gemma 3 270M"))
    assert f"{float(before):.2f} (SFT) → **{float(after):.2f}**" in row, row


def test_every_readme_result_row_names_the_command_that_regenerates_it() -> None:
    """Issue 50: every row of the README's Results table names a command (a committed script or
    module run on the raw files beside its page), and that script or module exists: `python
    X.py`, `bash X.sh`, or `python -m a.b` (a/b.py, or a package a/b/ with a __main__.py)."""
    import re

    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Results"):text.index("## Docs")]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert len(rows) >= 4
    for row in rows:
        cmds = re.findall(r"`((?:python|bash|sagc-jax) [^`]+)`", row.rsplit(" | ", 1)[-1])
        assert cmds, f"README Results row without a regeneration command: {row[:60]}"
        for cmd in cmds:
            words = cmd.split()
            if words[1] == "-m":
                mod = ROOT / words[2].replace(".", "/")
                target = mod.with_suffix(".py") if not mod.is_dir() else mod / "__main__.py"
            else:
                target = ROOT / words[1]
            assert target.is_file(), f"{row[:40]}: {cmd} names a missing {target}"
