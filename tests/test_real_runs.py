"""The real SmolLM2 SAGC run's decisions are reproducible (issue 32): its logged observations,
replayed through the controller with the run's own sagc config and `timing: model`, give the
same G at every step and the same logged straggler cost, queue and risks. Data committed under
docs/results/smollm2/run_files/ (tools/compare_real_runs.py --copy), so this never skips."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from sagc_jax.config import ConfigError, load_config, load_saved_config
from sagc_jax.config import sagc_constants as sc
from sagc_jax.config.sagc import SAGCConfig, migrate_legacy_sagc
from sagc_jax.experiments.curves import SAME_AS, data_dir
from sagc_jax.experiments.replay import logged_observations
from sagc_jax.sagc import make_policy

RUNS = Path(__file__).resolve().parents[1] / "docs/results/smollm2/run_files"
#: The 32-step runs at batch_policy: prompts (2 prompts a step, sagc.V 0.1), sagc_prompts.md.
RUNS_PROMPTS = RUNS.parent / "run_files_prompts"


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def replay(run_dir: Path, memories: dict, observed: Path | None = None
           ) -> tuple[list[int], list[dict], list[dict]]:
    """(the G the controller chooses at every step, the metrics it returns, the logged rows),
    feeding it each logged step as the trainer does (`observation_from` with timing: model),
    under the constants that ran (the run's own `sagc_constants.json` where it has one; else
    `memories`: the length model's were rows until 2026-12-05,
    ROW_MEMORIES; the model clock priced an unrun shape flat until 2026-12-06,
    FLAT_MODEL_COST; the warm-up started at the largest rung until 2026-12-06, FIXED_START;
    {} for today's), and the step's shape known before the first step, as the trainer's.
    `observed`: another run's logged steps, fed to the controller of `run_dir`'s config."""
    # The 16-step runs predate the issue-32 rewrite: load_saved_config migrates their sagc
    # section (every removed key held the value that is now a constant).
    cfg = load_saved_config(run_dir / "config.yaml")
    assert cfg.sagc.timing == "model"
    recorded = run_dir / sc.CONSTANTS_FILE  # runs since 2026-12-07 record their constants
    consts = (sc.load_constants(recorded) if recorded.is_file()
              else dataclasses.replace(sc.CONSTANTS, **memories))
    policy = make_policy(cfg.sagc, horizon=cfg.run.steps, consts=consts,
                         prompts=cfg.data.prompts_per_step,
                         max_new_tokens=cfg.sampling.max_new_tokens)
    chosen, out, metrics = [], [], []
    for logged in logged_observations(observed or run_dir, cfg.sagc, cfg.sampling.decode_chunk):
        chosen.append(policy.choose())
        out.append(policy.observe(logged.observation))
        metrics.append(logged.metrics)
    return chosen, out, metrics


@pytest.mark.parametrize("name", ["sagc", "static-4", "static-16"])
def test_real_run_files_complete(name):
    d = RUNS / name
    metrics = [m for m in _jsonl(d / "metrics.jsonl") if "group_size" in m]
    trace = _jsonl(d / "trace.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, 17))
    assert [t["step"] for t in trace] == list(range(1, 17))
    assert all(m["rows"] == 16 for m in metrics)


#: Every committed real SAGC run, with the constants it ran under: the 16- and 32-step runs
#: (smollm2/) and the first arith1 run of issue 49 with the memories in rows; the issue-49 runs
#: warmed up at G = 8 (sagc_real_init8/) and the first at the largest rung (sagc_real_init16/)
#: with today's memories but an unrun shape priced flat on the model clock; the runs of
#: today's controller (sagc_real/, and on this CPU's line sagc_real_cpuclock/).
SAGC_REAL = RUNS.parents[1] / "sagc_real"
SAGC_INIT16 = SAGC_REAL.parent / "sagc_real_init16"
SAGC_INIT8 = SAGC_REAL.parent / "sagc_real_init8"
#: Today's controller deciding on this CPU's fitted time model (benchmarks/cpu_time_model.py).
SAGC_CPU = SAGC_REAL.parent / "sagc_real_cpuclock"
#: The same, with `sagc.benefit: any_group` (docs/sagc.md, "What one step is worth"), and
#: with it warming up at the smallest rung (`sagc_real_cpuclock_any_init4/`).
SAGC_CPU_ANY = sorted(SAGC_REAL.parent.glob("sagc_real_cpuclock_any*/arith*/sagc-model-s*"))
#: `any_group` on the `model` clock (arith2: where the best static is 16; arith1: 4).
SAGC_ANY = sorted(SAGC_REAL.parent.glob("sagc_real_any/arith*/sagc-model-s*"))
#: Shipped SAGC on this CPU's line from the prior's start (pinned as initial_group_size 8).
SAGC_CPU_PRIOR = sorted(SAGC_REAL.parent.glob("sagc_real_cpuclock_prior/arith*/sagc-model-s*"))
#: The main job's cell (configs/tiny_cpu.yaml, 150 steps, 8 prompts a step), either benefit law.
SAGC_MAIN = sorted(SAGC_REAL.parent.glob("sagc_main_job*/arith/sagc-model-s*"))
#: `sagc.benefit: diminishing` on SmolLM2 (this CPU's line and the `model` clock; 2026-12-07).
SAGC_DIM = sorted(SAGC_REAL.parent.glob("sagc_real*_dim/arith*/sagc-model-s*"))
_FIXED = sc.FIXED_START
#: Runs trained since the prior's start became the default (twentieth session), before runs
#: recorded their constants (sagc_constants.json, which `replay` reads instead): they replay
#: under today's constants; on the `model` clock the prior picks the largest rung, as
#: FIXED_START does, so the runs before them replay under either.
_TODAY = {SAGC_REAL / "arith1/sagc-model-s2",
          SAGC_REAL.parent / "sagc_real_any/arith1/sagc-model-s0"}
_ROWS = {**sc.ROW_MEMORIES, **sc.FLAT_MODEL_COST, **_FIXED}
_FLAT = {**sc.FLAT_MODEL_COST, **_FIXED}
SAGC_RUNS = [(RUNS / "sagc", _ROWS), (RUNS_PROMPTS / "sagc", _ROWS),
             (SAGC_REAL.parent / "sagc_real_rowmem/arith1/sagc-model-s0", _ROWS),
             *((d, _FLAT) for d in sorted(SAGC_INIT8.glob("arith*/sagc-model-s*"))),
             *((d, _FLAT) for d in sorted(SAGC_INIT16.glob("arith*/sagc-model-s*"))),
             *((d, {} if d in _TODAY else _FIXED)
               for d in sorted(SAGC_REAL.glob("arith*/sagc-model-s*"))
               if not (d / SAME_AS).is_file()),
             *((d, _FIXED) for d in sorted(SAGC_CPU.glob("arith*/sagc-model-s*"))),
             *((d, {} if d in _TODAY else _FIXED) for d in (*SAGC_CPU_ANY, *SAGC_ANY)),
             *((d, {}) for d in (*SAGC_CPU_PRIOR, *SAGC_MAIN, *SAGC_DIM))]
#: SAGC runs not trained because they are a static run (`curves.SAME_AS`).
SAGC_SAME_AS = sorted(d for d in SAGC_REAL.glob("arith*/sagc-model-s*") if (d / SAME_AS).is_file())


@pytest.mark.parametrize("run_dir,memories", SAGC_RUNS,
                         ids=lambda x: "/".join(x.parts[-3:]) if isinstance(x, Path) else "")
def test_real_sagc_runs_replay_exactly(run_dir, memories):
    """A real SAGC run's logged observations give the G it ran at every step, with its logged
    straggler cost, queue, risks and reasons, under the constants it ran with (a controller
    change that moves them must pin those constants, as ROW_MEMORIES)."""
    chosen, out, metrics = replay(run_dir, memories)
    steps = load_saved_config(run_dir / "config.yaml").run.steps
    assert len(chosen) == steps and chosen == [m["group_size"] for m in metrics]
    for o, m in zip(out, metrics):
        for k in ("straggler_rate", "sagc_queue", "risk_g4", "risk_g8", "risk_g16"):
            assert o[k] == pytest.approx(m[k], rel=1e-9, abs=1e-12), (m["step"], k)
        assert o["sagc_reason"] == m["sagc_reason"]


@pytest.mark.parametrize("run_dir,steps", [(SAGC_INIT16 / "arith1/sagc-model-s0", 22),
                                           (SAGC_REAL / "arith1/sagc-model-s0", 21)],
                         ids=["init16-flat", "today"])
def test_sagc_run_is_the_static16_run_while_it_chooses_16(run_dir, steps):
    """Same seed and same G give the same rollouts: the SAGC run warmed up at the largest rung
    equals static-16's run of its seed step for step (loss, rewards, lengths) for as long as it
    chose 16 (22 steps with the flat model-clock pricing, 21 with today's, as replaying the
    static run predicted), and then chose 8."""
    def rows(d: Path) -> list[dict]:
        return [m for m in _jsonl(d / "metrics.jsonl") if "group_size" in m]
    sagc = rows(run_dir)
    static = rows(SAGC_REAL / "arith1/static-16-s0")
    same = [m["group_size"] == 16 for m in sagc].index(False)
    assert same == steps and sagc[same]["group_size"] == 8
    for a, b in zip(sagc[:same], static[:same]):
        assert [a[k] for k in ("loss", "reward_mean", "len_mean")] == \
            [b[k] for k in ("loss", "reward_mean", "len_mean")]
    assert sagc[same]["loss"] != static[same]["loss"]


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out |= _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
    return out


@pytest.mark.parametrize("run_dir", SAGC_SAME_AS, ids=lambda d: "/".join(d.parts[-2:]))
def test_sagc_run_not_trained_is_the_static_run_it_names(run_dir):
    """A SAGC run that stands for a static run (`curves.SAME_AS`): its config is that run's
    but for the policy (SAGC on, its rungs, no pinned start; run.dir and the model's path are
    where each ran), and its controller, fed that run's logged steps, chooses the static G at
    every step, so by induction over the steps it would have seen the same rollouts."""
    static = data_dir(run_dir)
    assert static != run_dir and static.name.startswith("static-")
    g = int(static.name.split("-")[1])
    mine = _flat(yaml.safe_load((run_dir / "config.yaml").read_text()))
    theirs = _flat(yaml.safe_load((static / "config.yaml").read_text()))
    differ = {k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k)}
    assert differ == {"run.dir", "model.path", "sagc.enabled", "sagc.group_sizes",
                      "sagc.initial_group_size"}
    assert mine["sagc.enabled"] and theirs["sagc.group_sizes"] == [g]
    assert g in mine["sagc.group_sizes"] and mine["sagc.initial_group_size"] is None
    chosen, _, metrics = replay(run_dir, {}, observed=static)
    assert chosen == [g] * load_saved_config(run_dir / "config.yaml").run.steps
    assert [m["group_size"] for m in metrics] == chosen


def test_real_prompts_run_moves_g_within_the_budget():
    """The 32-step prompts run (sagc_prompts.md): G changes after the warm-up, both 4 and 8 are
    run, and the run's mean tail share is within delta + 0.01 (the issue's budget test)."""
    metrics = [m for m in _jsonl(RUNS_PROMPTS / "sagc" / "metrics.jsonl") if "group_size" in m]
    g = [m["group_size"] for m in metrics]
    assert len(g) == 32 and all(m["rows"] == 2 * m["group_size"] for m in metrics)
    after = g[4:]
    assert {4, 8} <= set(after) and sum(a != b for a, b in itertools.pairwise(after)) >= 4
    assert np.mean([m["straggler_rate"] for m in metrics]) <= 0.6 + 0.01


def test_static16_run_trace_is_the_run_and_starts_as_the_recording():
    """configs/sim/traces/smollm2_static16_run_trace.jsonl is the static-16 run's trace, and its
    step 1 is the untrained G = 16 recording's step 1 row for row (same params, prompt, key)."""
    traces = RUNS.parents[3] / "configs/sim/traces"
    run = (RUNS / "static-16" / "trace.jsonl").read_text()
    assert (traces / "smollm2_static16_run_trace.jsonl").read_text() == run
    rec = json.loads((traces / "smollm2_static16_trace.jsonl").read_text().splitlines()[0])
    assert json.loads(run.splitlines()[0])["groups"] == rec["groups"]


def test_legacy_sagc_section_migrates_only_at_the_constants():
    """An old saved sagc section maps onto today's schema (time_model from model_*), and one
    whose removed key held another value is refused in one line naming the key."""
    old = yaml.safe_load((RUNS / "sagc" / "config.yaml").read_text())["sagc"]
    new = SAGCConfig.from_dict(migrate_legacy_sagc(old))
    assert new.time_model.decode_b == old["model_decode_b"] and new.delta == old["delta"]
    with pytest.raises(ValueError, match=r"sagc\.tie_margin") as e:
        migrate_legacy_sagc({**old, "tie_margin": 0.02})
    assert "\n" not in str(e.value)


def test_saved_pre_rewrite_config_loads_for_eval_and_export(tmp_path):
    """`load_saved_config` (what evaluate/export read a run's config.yaml with) migrates an old
    sagc section; one holding a setting the controller no longer has fails naming file and key."""
    path = RUNS / "sagc" / "config.yaml"
    raw = yaml.safe_load(path.read_text())
    cfg = load_saved_config(path)
    # Saved before `sagc.benefit` existed: the `groups` it ran under, whatever the default.
    assert cfg.sagc == SAGCConfig.from_dict({**migrate_legacy_sagc(raw["sagc"]),
                                             "benefit": "groups"})
    assert cfg.run.steps == raw["run"]["steps"]
    assert cfg.model.lora.rank == raw["model"]["lora"]["rank"]
    with pytest.raises(ConfigError, match=r"sagc\.count_truncated"):
        load_config(path)  # a *new* config with a removed key is still refused
    bad = tmp_path / "config.yaml"
    bad.write_text(yaml.safe_dump({**raw, "sagc": {**raw["sagc"], "credit_cap": 9.0}}))
    with pytest.raises(ConfigError, match=r"config\.yaml: sagc\.credit_cap") as e:
        load_saved_config(bad)
    assert "\n" not in str(e.value)


def test_saved_config_keeps_the_benefit_it_ran_under(tmp_path):
    """A config saved before `sagc.benefit` existed loads as `groups` (what every such run
    priced a step by), one that names it keeps it, and a new config gets the default."""
    path = SAGC_REAL / "arith1" / "sagc-model-s0" / "config.yaml"
    raw = yaml.safe_load(path.read_text())
    assert "benefit" not in raw["sagc"]
    assert load_saved_config(path).sagc.benefit == "groups"
    assert load_config(path).sagc.benefit == SAGCConfig().benefit
    for form in ("groups", "any_group"):
        named = tmp_path / f"{form}.yaml"
        named.write_text(yaml.safe_dump({**raw, "sagc": {**raw["sagc"], "benefit": form}}))
        assert load_saved_config(named).sagc.benefit == form


def test_compare_real_runs_recomputes_the_committed_table():
    """tools/compare_real_runs.py (the committed comparison's source) still reads the run
    files: its per-run rows equal those committed in sagc_vs_static_table.md."""
    from tools import compare_real_runs as mod

    runs = {n: mod.load_run(RUNS / n) for n in ("sagc", "static-4", "static-16")}
    rows = mod.table(runs, 0.6)[2:]
    committed = (RUNS.parent / "sagc_vs_static_table.md").read_text().splitlines()
    for row in rows:
        assert row in committed, row


def test_readme_run_with_evals_equals_the_evals_off_run():
    """The README run of the real config (evals at 0/16/32, docs/results/smollm2/metrics.jsonl)
    and the evals-off comparison run took the same steps: evals draw nothing from training."""
    readme = [m for m in _jsonl(RUNS.parent / "metrics.jsonl") if "group_size" in m]
    off = [m for m in _jsonl(RUNS_PROMPTS / "sagc" / "metrics.jsonl") if "group_size" in m]
    keys = ("group_size", "rows", "reward_mean", "len_mean", "truncated_frac", "straggler_rate",
            "sagc_queue", "loss")
    assert [[m[k] for k in keys] for m in readme] == [[m[k] for k in keys] for m in off]
    assert any("eval_accuracy" in m for m in _jsonl(RUNS.parent / "metrics.jsonl"))


def test_logged_observations_refuse_a_trace_that_is_not_the_metrics(tmp_path):
    """experiments.replay: a step whose logged decode steps are not its longest traced row
    rounded up to the decode chunk is refused, naming the step (files of two different runs)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(RUNS / "sagc", run)
    rows = _jsonl(run / "metrics.jsonl")
    for m in rows:
        if m.get("step") == 3 and "group_size" in m:
            m["decode_steps"] += 16
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in rows))
    cfg = load_saved_config(run / "config.yaml")
    steps = logged_observations(run, cfg.sagc, cfg.sampling.decode_chunk)
    assert [next(steps).metrics["step"] for _ in range(2)] == [1, 2]
    with pytest.raises(ValueError, match="step 3: decode_steps"):
        next(steps)


def test_noise_scale_page_is_its_committed_runs(capsys):
    """tools/noise_scale_table.py over the committed noise-scale runs prints the rows their page
    quotes, and B_noise over each whole run is far above the largest batch SAGC can choose (the
    page's and docs/sagc.md's reading: the noise scale does not saturate at 8-32 rows)."""
    from tools import noise_scale_table as mod

    folder = RUNS.parents[1] / "noise_scale"
    runs = sorted(p for p in folder.iterdir() if (p / "metrics.jsonl").is_file())
    assert len(runs) >= 1
    assert mod.main([str(r) for r in runs]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ")][1:]
    page = (folder / "README.md").read_text().splitlines()
    for row in rows:
        assert row in page, row
    for r in runs:
        terms = mod.read_rows(r)
        b = mod.noise_scale_rows([x["grad_norm"] ** 2 for x in terms],
                                 [x["noise_chunk_grad_sq"] for x in terms],
                                 [x["noise_weight_share"] for x in terms],
                                 [x["scored_rows"] for x in terms])
        assert b is not None and b > 10 * max(x["scored_rows"] for x in terms), (r.name, b)
