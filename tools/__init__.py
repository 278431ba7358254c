"""Tested tools: what CI, the tests and the docs' regeneration commands run (not shipped in the
wheel; `sagc_jax/` is the product, `benchmarks/` the research code).

Run each from the repository root as a module, ``python -m tools.<name>`` (the root is then on
``sys.path``, so the tools import each other as ``tools.<name>``), or through its shell script
(``bash tools/gpu.sh``):

* docs: ``check_docs`` (broken references), ``gen_config_docs`` (docs/config.md),
  ``build_tokenizer`` (the packaged tokenizer asset);
* results pages from committed raw files: ``main_job_figures``, ``tool_job_figures``,
  ``run_figures``, ``compare_real_runs``; SAGC's benefit-model tables in docs/sagc.md:
  ``sagc_benefit_forms`` (from the real runs), ``sagc_benefit_law`` (from simulator suite runs);
* ``reliability`` (``python -m tools.reliability``): the fuzz and fault-injection harness;
* the simulator suite: ``sagc_suite``, ``sagc_sweep``, ``sagc_replicates``,
  ``sagc_ablation.sh`` (benchmarks/sagc_sim.md);
* the prepared GPU calls: ``gpu.sh`` (``gpu_bench``, ``gpu_steps``, ``gpu_timing``;
  ``gpu_report`` prints their tables), ``gpu_profile.sh`` (``gpu_profile``) and
  ``prepare_gpu_wheels.sh``.
"""
