"""sagc-jax: a JAX-native GRPO trainer with Straggler-Aware Group Control."""

__version__ = "0.1.0"
