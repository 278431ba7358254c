"""Command line: `sagc-jax {train,simulate,eval,export} ...`."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from sagc_jax import __version__
from sagc_jax.cli_errors import (  # noqa: F401  (tests import them from here too)
    _STORAGE,
    _is_disk_full,
    _os_errno,
    _quiet_closed_loop_callbacks,
    _quiet_library_tracebacks,
    _silence_abandoned_saves,
    _train_error,
    input_errors,
)
from sagc_jax.errors import Interrupted


def _stopped(prog: str, e: Interrupted) -> int:
    """One line for a run stopped by Ctrl-C / SIGTERM; its exit code, 128 + signum. A second
    signal (`e.at_once`) exits here: the save it abandoned would have Orbax's threads either
    log their failure after this line or, cut at the wrong moment, keep the interpreter from
    exiting (seen: a CI run hung 300 s). The last checkpoint is on disk and a partial one is
    ignored on resume, so nothing waits for them."""
    print(f"{prog}: {e}", file=sys.stderr)
    if e.at_once:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + e.signum)
    return 128 + e.signum


def _train(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="sagc-jax train",
                                description="GRPO training with SAGC group-size control.")
    p.add_argument("--config", help="YAML config file (defaults if omitted)")
    p.add_argument("--dry-run", action="store_true",
                   help="build everything abstractly, print sizes and shapes, and exit")
    p.add_argument("--devices", type=int,
                   help="with --dry-run: size the run on N fake CPU devices (a subprocess; "
                   "default: the config's mesh size when fixed and different from this machine)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="with --dry-run: compile the largest shapes for XLA's memory plan "
                   "(default: models up to 2B params)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dot-path overrides, e.g. sagc.delta=0.05 run.steps=10")
    args = p.parse_intermixed_args(argv)  # lets --dry-run come after key=value
    from sagc_jax.hostmem import computes_on_cpu, keep_freed_memory

    if computes_on_cpu():  # before JAX's threads exist: see hostmem's docstring
        keep_freed_memory()
    from sagc_jax.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, args.overrides)
    except (ConfigError, FileNotFoundError) as e:
        print(f"sagc-jax train: config error: {e}", file=sys.stderr)
        return 2
    from sagc_jax.parallel import initialize_distributed

    try:
        initialize_distributed(cfg.distributed)  # before anything queries devices
    except ValueError as e:
        print(f"sagc-jax train: distributed error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        from sagc_jax.dryrun import run_dry_run

        child = [*(["--config", args.config] if args.config else []),
                 *([] if args.compile is None else ["--compile" if args.compile
                                                    else "--no-compile"]), *args.overrides]
        return run_dry_run(cfg, child, devices=args.devices, compile=args.compile,
                           prog="sagc-jax train: dry run")
    from sagc_jax.train import train

    _quiet_library_tracebacks()
    try:
        row = train(cfg)
    except Interrupted as e:  # Ctrl-C / SIGTERM: 130 / 143, so scripts can tell it from done
        return _stopped("sagc-jax train", e)
    except KeyboardInterrupt:  # before the run's own handlers were installed
        print("sagc-jax train: interrupted (Ctrl-C) before training started", file=sys.stderr)
        return 130
    except Exception as e:
        if os.environ.get("SAGC_JAX_TRACEBACK"):
            raise
        print(f"sagc-jax train: error: {_train_error(e, cfg.run.dir)}", file=sys.stderr)
        # A run dir removed or made read-only under the run is a runtime failure (1), though
        # the FileNotFoundError it raises would read as a missing input (2).
        runtime = _os_errno(e) in _STORAGE and cfg.run.dir in str(e)
        return 2 if isinstance(e, input_errors()) and not runtime else 1
    if row:
        print(f"[sagc-jax] done: step {row['step']}, reward {row['reward_mean']:.3f}, "
              f"G={row['group_size']}; outputs in {cfg.run.dir}")
    return 0


def _writable_file(path: str) -> str | None:
    """Why `path` cannot be written as a new or replaced file (None if it can), checked before
    a long computation whose result would be lost."""
    p = os.path.abspath(path)
    if os.path.isdir(p):
        return "is a directory"
    parent = os.path.dirname(p)
    while not os.path.exists(parent):  # created on write: check the nearest existing ancestor
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(p)
                                                    and not os.access(p, os.W_OK)):
        return "permission denied"
    return None


def _simulate(argv: list[str]) -> int:
    from sagc_jax.sagc.simulate_cli import simulate_main

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--out")
    pre.add_argument("--plot")
    known, _ = pre.parse_known_args(argv)
    for flag in ("out", "plot"):
        path = getattr(known, flag)
        why = path is not None and _writable_file(path)
        if why:
            print(f"sagc-jax simulate: error: --{flag} {path}: cannot write there ({why})",
                  file=sys.stderr)
            return 2
    try:
        return simulate_main(argv)
    except OSError as e:  # e.g. the disk filled while writing the result
        print(f"sagc-jax simulate: error: {e}", file=sys.stderr)
        return 1


def _eval(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="sagc-jax eval",
        description="Greedy accuracy and pass@k of a run's checkpoint or an HF model directory.")
    p.add_argument("--checkpoint", required=True,
                   help="run dir, its checkpoints/ dir, a step dir, or an HF model dir")
    p.add_argument("--data", help="JSONL/Parquet file or built-in task name (default: the run "
                   "config's eval split)")
    p.add_argument("--num-samples", type=int, default=8, help="k samples per prompt for pass@k "
                   "(0 = greedy only; default 8)")
    p.add_argument("--max-new-tokens", type=int, help="default: the run's sampling value, or 128")
    p.add_argument("--temperature", type=float, help="default: the run's sampling value, or 1.0")
    p.add_argument("--limit", type=int, help="evaluate only the first N examples")
    p.add_argument("--batch-prompts", type=int, default=8, help="prompts per sampler call")
    p.add_argument("--reward", action="append", metavar="NAME", help="reward function (repeat "
                   "for several; the first decides correctness); default: the run's rewards")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--out", help="write the metrics and per-prompt results as JSON here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    err = "sagc-jax eval: error:"
    for name in ("num_samples", "max_new_tokens", "limit", "batch_prompts"):
        v = getattr(args, name)
        if v is not None and v < (0 if name == "num_samples" else 1):
            print(f"{err} --{name.replace('_', '-')} must be positive, got {v}", file=sys.stderr)
            return 2
    why = args.out is not None and _writable_file(args.out)
    if why:
        print(f"{err} --out {args.out}: cannot write there ({why})", file=sys.stderr)
        return 2
    import json

    from sagc_jax.config import ConfigError
    from sagc_jax.data.readers import DataError
    from sagc_jax.data.tasks import TASKS, get_task
    from sagc_jax.data.tokenizer import TokenizerError
    from sagc_jax.evaluate import evaluate, format_table, load_eval_examples
    from sagc_jax.models.hf import ModelFileError
    from sagc_jax.open_run import CheckpointPathError, load_policy, resolve_checkpoint
    from sagc_jax.rewards import RewardFn, build_reward_fns

    try:
        # Cheap checks of both paths before any model is loaded.
        resolve_checkpoint(args.checkpoint)
        if args.data is not None and not os.path.isfile(args.data) and args.data not in TASKS:
            raise DataError(f"--data {args.data}: no such file and not a built-in task "
                            f"({', '.join(sorted(TASKS))})")
        model, tok, cfg = load_policy(args.checkpoint)
        examples, task = load_eval_examples(args.data, cfg, limit=args.limit)
        if args.reward:
            reward_fns = [RewardFn.from_name(r) for r in args.reward]
        elif cfg is not None:
            reward_fns = build_reward_fns(cfg.rewards, cfg.reward_timeout_s)
        else:  # a bare HF model: the task's verifier, or exact-answer matching for a file
            reward_fns = [RewardFn.from_name(get_task(task).default_reward if task
                                             else "exact_answer")]
        from sagc_jax.data.columns import check_examples, required_columns

        check_examples(examples, required_columns(cfg, reward_fns, "eval"),
                       args.data or cfg.data.eval_file or f"data.task {task}")
        s = cfg.sampling if cfg is not None else None
        result = evaluate(
            model, tok, examples, reward_fns=reward_fns, num_samples=args.num_samples,
            max_new_tokens=args.max_new_tokens or (s.max_new_tokens if s else 128),
            temperature=args.temperature if args.temperature is not None
            else (s.temperature if s else 1.0),
            batch_prompts=args.batch_prompts, seed=args.seed,
            chat_template=cfg.data.chat_template if cfg is not None else False,
            decode_chunk=s.decode_chunk if s else 16, details=args.out is not None,
            progress=not args.no_progress)
    except (CheckpointPathError, ConfigError, DataError, FileNotFoundError, ModelFileError,
            TokenizerError) as e:
        print(f"{err} {(str(e) or type(e).__name__).splitlines()[0]}", file=sys.stderr)
        return 2
    except (ValueError, OSError, RuntimeError) as e:  # incl. RewardError, mismatched checkpoint
        print(f"{err} {(str(e) or type(e).__name__).splitlines()[0]}", file=sys.stderr)
        return 1
    result = {"checkpoint": args.checkpoint, "data": args.data or "run config eval split",
              **result}
    print(format_table(result))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


def _export(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="sagc-jax export",
        description="Write a checkpoint as a Hugging Face model dir (config.json, safetensors, "
                    "tokenizer).")
    p.add_argument("--checkpoint", required=True,
                   help="run dir, its checkpoints/ dir, a step dir, or an HF model dir")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--force", action="store_true", help="write into a non-empty --out")
    p.add_argument("--format", choices=("merged", "peft"), default="merged",
                   help="merged: HF weights with LoRA adapters merged in (default); peft: the "
                        "LoRA adapters only, as a PEFT adapter dir for the run's model.path")
    args = p.parse_args(argv)
    from sagc_jax.data.tokenizer import TokenizerError
    from sagc_jax.export import export
    from sagc_jax.models.hf import ModelFileError
    from sagc_jax.models.peft import NoAdaptersError
    from sagc_jax.open_run import CheckpointPathError

    try:
        dest = export(args.checkpoint, args.out, overwrite=args.force, fmt=args.format)
    except (CheckpointPathError, FileExistsError, ModelFileError, TokenizerError,
            NoAdaptersError) as e:
        print(f"sagc-jax export: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:
        print(f"sagc-jax export: error: {(str(e) or type(e).__name__).splitlines()[0]}",
              file=sys.stderr)
        return 1
    import jax

    if jax.process_index() == 0:
        print(f"[sagc-jax] exported {args.checkpoint} to {dest}")
    return 0


def _compare(argv: list[str]) -> int:
    from sagc_jax.experiments.policies import DEFAULT_POLICIES

    p = argparse.ArgumentParser(
        prog="sagc-jax compare",
        description="Train SAGC and static-G policies on the same config, seeds and step budget, "
                    "evaluate each final checkpoint, and write results.md/json and plots.")
    p.add_argument("--config", required=True, help="base YAML config (e.g. "
                   "configs/compare_cpu.yaml)")
    p.add_argument("--out-dir", default="runs/compare", help="output directory (default "
                   "runs/compare); runs go to <out>/<policy>-s<seed>")
    p.add_argument("--seeds", default="0,1", help="comma-separated seeds (default 0,1)")
    p.add_argument("--policies", default=DEFAULT_POLICIES,
                   help=f"static-<G> and/or sagc, comma-separated (default {DEFAULT_POLICIES})")
    p.add_argument("--target", default="auto", help="training-reward target for "
                   "time-to-target, or 'auto' (80%% of the way from the initial to the best "
                   "final reward; default)")
    p.add_argument("--window", type=int, default=10, help="moving-average window in steps for "
                   "the target crossing and plots (default 10)")
    p.add_argument("--num-samples", type=int, default=0, help="eval: k samples per prompt for "
                   "pass@k (default 0 = greedy accuracy only)")
    p.add_argument("--eval-limit", type=int, help="eval: only the first N held-out problems")
    p.add_argument("--eval-batch", type=int, default=50, help="eval: prompts per sampler call")
    p.add_argument("--no-share-sft", action="store_true",
                   help="run the SFT warm start in every run instead of once per seed")
    p.add_argument("--summarize-only", action="store_true",
                   help="do not train: evaluate and summarise the existing run directories")
    p.add_argument("--budget-s", help="equal wall-clock budget: read every run up to this many "
                   "seconds on --clock, or 'auto' (the smallest run total); default: none "
                   "(equal step budgets)")
    p.add_argument("--clock", default="measured", choices=("model", "measured"),
                   help="clock of the budget and time-to-target: 'model' = modelled "
                   "accelerator rollout seconds (deterministic), 'measured' = this machine's "
                   "real clock (default)")
    p.add_argument("--max-steps", help="per-policy run.steps caps, e.g. "
                   "static-4=40,static-16=25,sagc=40 (others use the config's run.steps)")
    p.add_argument("--curves", action="store_true",
                   help="evaluate every kept checkpoint: held-out accuracy against seconds on "
                   "both clocks, accuracy at budget and time to target (curves.json)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="overrides applied to every run, e.g. run.steps=40")
    args = p.parse_args(argv)
    err = "sagc-jax compare: error:"
    from sagc_jax.experiments.policies import parse_policies, parse_seeds

    try:
        seeds = parse_seeds(args.seeds)
        policies = parse_policies(args.policies)
        target = None if args.target == "auto" else float(args.target)
        from sagc_jax.experiments.budget import parse_max_steps, resolve_budget

        max_steps = parse_max_steps(args.max_steps)
        budget = args.budget_s if args.budget_s in (None, "auto") else resolve_budget(
            args.budget_s, [])
        if args.window < 1 or args.num_samples < 0 or args.eval_batch < 1 or (
                args.eval_limit is not None and args.eval_limit < 1):
            raise ValueError("--window, --eval-batch and --eval-limit must be >= 1 and "
                             "--num-samples >= 0")
    except ValueError as e:
        print(f"{err} {e}", file=sys.stderr)
        return 2
    from sagc_jax.config import ConfigError
    from sagc_jax.experiments import run_comparison

    try:
        run_comparison(args.config, args.out_dir, seeds=seeds, policies=policies,
                       overrides=args.overrides, target=target, window=args.window,
                       num_samples=args.num_samples, eval_limit=args.eval_limit,
                       eval_batch=args.eval_batch, train=not args.summarize_only,
                       share_sft=not args.no_share_sft, budget_s=budget, clock=args.clock,
                       max_steps=max_steps, curves=args.curves)
    except ConfigError as e:
        print(f"{err} config: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:  # Ctrl-C / SIGTERM in a run: its checkpoint is saved, as in train
        return _stopped("sagc-jax compare", e)
    except (ValueError, OSError, RuntimeError) as e:  # incl. TrainingError
        print(f"{err} {(str(e) or type(e).__name__).splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


COMMANDS = {
    "train": (_train, "train a policy with GRPO + SAGC"),
    "simulate": (_simulate, "compare SAGC with static group sizes on a workload model or trace"),
    "eval": (_eval, "greedy accuracy and pass@k of a checkpoint or HF model"),
    "export": (_export, "write a checkpoint as a Hugging Face model directory"),
    "compare": (_compare, "train SAGC and static-G policies on one config and compare them"),
}


class _StdoutHandler(logging.StreamHandler):
    """Library messages (`logging`, INFO and up) on the current `sys.stdout`, looked up at each
    message so redirected or captured output gets them too."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:
        pass


def setup_logging() -> None:
    """`[sagc-jax] message` lines on stdout for the package's loggers (once per process)."""
    log = logging.getLogger("sagc_jax")
    if not any(isinstance(h, _StdoutHandler) for h in log.handlers):
        handler = _StdoutHandler()
        handler.setFormatter(logging.Formatter("[sagc-jax] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


#: Set (unless the user set them) before transformers is imported: every model and tokenizer is
#: a local path or already in the local HF cache, so nothing reaches for the network at run time.
OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def go_offline() -> None:
    """HF hub offline for this process and its children, unless the user chose otherwise."""
    for name in OFFLINE_ENV:
        os.environ.setdefault(name, "1")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    go_offline()
    setup_logging()
    usage = "usage: sagc-jax [--version] {" + ",".join(COMMANDS) + "} [--help] ..."
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        print("\nsagc-jax: a JAX-native GRPO trainer with Straggler-Aware Group Control.\n")
        for name, (_, desc) in COMMANDS.items():
            print(f"  {name:10s} {desc}")
        print("\nRun `sagc-jax COMMAND --help` for a command's options.")
        return 0
    if argv[0] == "--version":
        print(f"sagc-jax {__version__}")
        return 0
    if argv[0] not in COMMANDS:
        print(f"sagc-jax: unknown command '{argv[0]}'\n{usage}", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]][0](argv[1:])


def entry(argv: list[str] | None = None) -> None:
    """The `sagc-jax` program: `main`, then exit with its code. A command that stopped or
    failed has printed its one line; what Python's exit then shakes loose from an abandoned
    save (Orbax's threads, write coroutines) is silenced here, in the process that is ending,
    not in `main`, which tests and notebooks call in-process."""
    code = main(argv)
    if code:
        _silence_abandoned_saves()
    sys.exit(code)


if __name__ == "__main__":
    entry()
