"""TRL's `GRPOTrainer` side of benchmarks/real_model.py: a few GRPO steps, each part timed.

Runs in its own venv (TRL pins its own stack; see benchmarks/README.md), launched by
real_model.py as a subprocess:

    /work/trl-venv/bin/python benchmarks/trl_grpo.py --spec spec.json --out steps.jsonl

`spec.json` (written by real_model.py): model_dir + gguf_file (transformers loads the GGUF,
dequantised to f32, then copied into a plain model: see `plain_model`), prompts (chat messages, gold
entry, reasoning-gym dataset name and settings), G, cap, steps, lr, threads, seed, bf16
(optional: `GRPOConfig(bf16=True)`, bf16 autocast over f32 weights). One GRPO step
= one generation of prompts_per_step x G rows, then one optimizer step on them
(steps_per_generation 1, num_iterations 1), with the loss settings real_model.py uses for ours:
beta 0, epsilon 0.2 / 0.28, token-mean ('dapo') aggregation, group-scaled advantages.

Per step it writes one JSON line: wall seconds of the whole step, of TRL's own
`_generate_and_score_completions` (rollout + rewards + advantages), of its
`transformers.generate` call, of the reward function, and the completion token count.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _patch_profiling(sink: dict[str, float]) -> None:
    """TRL times its parts but logs them only to wandb/mlflow/trackio: keep them here."""
    from trl.extras import profiling

    def log(self: Any, duration: float) -> None:
        key = self.name.split(".", 1)[-1] if self.name.startswith("GRPOTrainer.") else self.name
        sink[key] = sink.get(key, 0.0) + duration

    profiling.ProfilingContext._log_metrics = log


def plain_model(model_dir: str, gguf_file: str) -> Any:
    """transformers' GGUF loading (dequantised to f32), copied into a plain model of the same
    config: transformers' Trainer refuses (and `save_pretrained` will not write) a model loaded
    with `gguf_file`, which it marks as quantized although its weights are f32 tensors."""
    import torch
    from transformers import AutoModelForCausalLM

    q = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=gguf_file, dtype=torch.float32)
    cfg = q.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.load_state_dict(q.state_dict())
    model.generation_config = q.generation_config
    return model


def _reward_fn(scorers: dict[str, Any]):
    """reasoning-gym `score_answer` on the last <answer> block (lenient: last number/line)."""
    from reasoning_gym.utils import extract_answer

    num = re.compile(r"-?\d+(?:\.\d+)?")

    def reward(completions: list[Any], entry: list[str], dataset: list[str], **_: Any):
        out = []
        for comp, e, ds in zip(completions, entry, dataset):
            text = comp[0]["content"] if isinstance(comp, list) else comp
            ent = json.loads(e)
            ans = extract_answer(text)
            if ans is None:
                if num.fullmatch(str(ent["answer"]).strip()):
                    nums = num.findall(text)
                    ans = nums[-1] if nums else None
                else:
                    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
                    ans = lines[-1] if lines else None
            out.append(float(scorers[ds].score_answer(ans, entry=ent)) if ans else 0.0)
        return out

    return reward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    spec = json.loads(Path(args.spec).read_text())

    import reasoning_gym
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(spec["model_dir"], gguf_file=spec["gguf_file"])
    model = plain_model(spec["model_dir"], spec["gguf_file"])
    load_s = time.perf_counter() - t0

    scorers = {d: reasoning_gym.create_dataset(d, size=1, seed=0, **kw)
               for d, kw in spec["datasets"].items()}
    p = spec["prompts"]  # in step order: prompts_per_step per step, no shuffling
    ds = Dataset.from_dict({"prompt": [x["messages"] for x in p],
                            "entry": [json.dumps(x["entry"]) for x in p],
                            "dataset": [x["dataset"] for x in p]})
    rows = spec["prompts_per_step"] * spec["G"]
    cfg = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_grpo_"), use_cpu=True,
        bf16=spec.get("bf16", False),
        per_device_train_batch_size=rows, gradient_accumulation_steps=1, num_generations=spec["G"],
        max_completion_length=spec["cap"], temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo", scale_rewards="group",
        num_iterations=1, learning_rate=spec["lr"], lr_scheduler_type="constant",
        warmup_steps=0, max_grad_norm=1.0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999,
        max_steps=spec["steps"], logging_steps=1, report_to=[], save_strategy="no",
        shuffle_dataset=False, seed=spec["seed"], dataloader_num_workers=0,
        disable_dropout=True, log_completions=False)

    parts: dict[str, float] = {}
    _patch_profiling(parts)
    trainer = GRPOTrainer(model=model, reward_funcs=[_reward_fn(scorers)], args=cfg,
                          train_dataset=ds, processing_class=tok)

    gen = trainer._generate_and_score_completions
    ntok: list[int] = []

    def timed_gen(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        out = gen(*a, **k)
        parts["generate_and_score"] = parts.get("generate_and_score", 0.0) + (
            time.perf_counter() - t)
        ntok.append(int(out["completion_mask"].sum()))
        return out

    trainer._generate_and_score_completions = timed_gen

    sink = open(args.out, "w")  # noqa: SIM115 (closed at the end)

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            parts.clear()
            self.t = time.perf_counter()

        def on_step_end(self, a: Any, state: Any, *_: Any, **__: Any) -> None:
            rec = dict(step=state.global_step, step_s=time.perf_counter() - self.t,
                       tokens=ntok[-1] if ntok else None, load=os.getloadavg()[0],
                       model_load_s=load_s, **parts)
            sink.write(json.dumps(rec) + "\n")
            sink.flush()

    trainer.add_callback(StepTimer())
    trainer.train()
    sink.close()


if __name__ == "__main__":
    main()
