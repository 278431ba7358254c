"""The training run: `train(cfg)` (see `train.loop` for the one-way step).

Modules: `state` (RunState), `steps` (the compiled steps), `learner` (update), `sft`
(warm start), `setup` (build a run), `loop` (the loop); cross-process agreement is
`sagc_jax.hosts`.
"""

from sagc_jax.errors import TrainingError

__all__ = ["TrainingError", "train"]


def train(cfg, *, progress=None, timing=None):
    """`train.loop.train` (imported lazily: `import sagc_jax.train` stays light)."""
    from sagc_jax.train.loop import train as _train

    return _train(cfg, progress=progress, timing=timing)
