"""Command line: `sagc-jax {train,simulate,eval,export} ...`."""

from __future__ import annotations

import argparse
import sys

from sagc_jax import __version__


def _train(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="sagc-jax train",
                                description="GRPO training with SAGC group-size control.")
    p.add_argument("--config", help="YAML config file (defaults if omitted)")
    p.add_argument("--dry-run", action="store_true",
                   help="build everything abstractly, print sizes and shapes, and exit")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="dot-path overrides, e.g. sagc.delta=0.05 run.steps=10")
    args = p.parse_args(argv)
    from sagc_jax.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, args.overrides)
    except (ConfigError, FileNotFoundError) as e:
        print(f"sagc-jax train: config error: {e}", file=sys.stderr)
        return 2
    from sagc_jax.trainer import Trainer, TrainingError

    try:
        trainer = Trainer(cfg)
        row = trainer.train()
    except (TrainingError, ValueError, FileNotFoundError, FileExistsError, OSError) as e:
        print(f"sagc-jax train: error: {e}", file=sys.stderr)
        return 1
    if row:
        print(f"[sagc-jax] done: step {row['step']}, reward {row['reward_mean']:.3f}, "
              f"G={row['group_size']}; outputs in {cfg.run.dir}")
    return 0


def _simulate(argv: list[str]) -> int:
    from sagc_jax.sagc.simulate import simulate_main

    return simulate_main(argv)


COMMANDS = {
    "train": (_train, "train a policy with GRPO + SAGC"),
    "simulate": (_simulate, "compare SAGC with static group sizes on a workload model or trace"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
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


if __name__ == "__main__":
    sys.exit(main())
