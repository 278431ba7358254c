#!/usr/bin/env bash
# Run sagc-jax on every host of an EXISTING Cloud TPU VM slice (e.g. a v5e-16: 4 hosts x 4
# chips). Creates nothing: it ssh-es to all workers at once and runs the same command on each,
# one process per host; JAX finds the other hosts from the TPU metadata
# (distributed.initialize=always is appended), builds one global mesh over all chips, and each
# host feeds its own share of the prompts.
#
#   TPU_NAME=my-v5e-16 ZONE=us-west4-a PROJECT=my-project \
#     launch/tpu_pod.sh CONFIG [ARGS ...]
#
#   CONFIG   path relative to the repo on the workers, e.g.
#            configs/qwen2.5-1.5b_gsm8k_tpu-v5e-16.yaml
#   ARGS     --dry-run and/or key=value overrides, passed to `sagc-jax train` on every host
#
# Required env: TPU_NAME, ZONE, PROJECT.
# Optional env (defaults in brackets):
#   REPO_DIR    [~/sagc-jax]  repo checkout on each worker
#   REPO_URL    [unset]       git URL cloned into REPO_DIR when it is missing (else the dir must
#                             exist on every worker, e.g. copied with `gcloud ... scp --worker=all`)
#   GIT_REF     [unset]       branch/tag/commit to check out before installing
#   INSTALL     [1]           1 = `pip install -e REPO_DIR "jax[tpu]"` on every worker first
#   JAX_TPU     [jax[tpu]]    the JAX TPU requirement to install (pin it: 'jax[tpu]==0.10.2')
#   CACHE_DIR   [~/.cache/sagc-jax/jax]  JAX_COMPILATION_CACHE_DIR on the workers (a gs://
#                             bucket works too and is shared by all hosts and restarts)
#   DETACH      [0]           1 = start under nohup on each worker (log: ~/sagc-jax-train.log)
#                             and return; 0 = stream all workers' output here (the run dies with
#                             the ssh session)
#   DRY_RUN_ONLY [0]          1 = only `python -m sagc_jax.dryrun` on worker 0 (no training)
#
# Storage: every path in the config (model.path, model.tokenizer, data.*) must exist on EVERY
# worker; run.dir should be shared (Filestore/NFS, or a gcsfuse-mounted bucket) so a restarted
# slice resumes from its checkpoints. All hosts take part in Orbax saves; only process 0 writes
# metrics, plots and exports.
set -euo pipefail

: "${TPU_NAME:?set TPU_NAME (the TPU VM name)}"
: "${ZONE:?set ZONE (e.g. us-west4-a)}"
: "${PROJECT:?set PROJECT (the GCP project id)}"
if [[ $# -lt 1 ]]; then
  sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
config=$1
shift

REPO_DIR=${REPO_DIR:-'~/sagc-jax'}
CACHE_DIR=${CACHE_DIR:-'~/.cache/sagc-jax/jax'}
JAX_TPU=${JAX_TPU:-'jax[tpu]'}
INSTALL=${INSTALL:-1}

# --dry-run goes before the overrides (argparse takes one run of key=value positionals).
flags=()
overrides=()
for a in "$@"; do
  if [[ $a == --* ]]; then flags+=("$a"); else overrides+=("$a"); fi
done
# Quote the train arguments once, so they survive the remote shell unchanged.
train_args=$(printf '%q ' "${flags[@]}" --config "$config" distributed.initialize=always \
  "${overrides[@]}")

remote="set -euo pipefail
if [ ! -d $REPO_DIR ]; then
  if [ -z '${REPO_URL:-}' ]; then echo \"no $REPO_DIR on \$(hostname) and REPO_URL unset\" >&2; exit 2; fi
  git clone '${REPO_URL:-}' $REPO_DIR
fi
cd $REPO_DIR
if [ -n '${GIT_REF:-}' ]; then git fetch --all --quiet && git checkout --quiet '${GIT_REF:-}'; fi
if [ '$INSTALL' = 1 ]; then
  python3 -m pip install --quiet --upgrade pip
  python3 -m pip install --quiet -e . '$JAX_TPU'
fi
export PATH=\$HOME/.local/bin:\$PATH
export JAX_COMPILATION_CACHE_DIR=$CACHE_DIR
export TPU_STDERR_LOG_LEVEL=\${TPU_STDERR_LOG_LEVEL:-2}
export TPU_MIN_LOG_LEVEL=\${TPU_MIN_LOG_LEVEL:-2}
export TOKENIZERS_PARALLELISM=false
"
if [[ ${DRY_RUN_ONLY:-0} == 1 ]]; then
  dry_args=$(printf '%q ' --config "$config" "${overrides[@]}")
  remote+="python3 -m sagc_jax.dryrun $dry_args"
  worker=0
elif [[ ${DETACH:-0} == 1 ]]; then
  remote+="nohup sagc-jax train $train_args > ~/sagc-jax-train.log 2>&1 < /dev/null &
echo \"\$(hostname): started, log ~/sagc-jax-train.log\""
  worker=all
else
  remote+="sagc-jax train $train_args"
  worker=all
fi

exec gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" --project "$PROJECT" \
  --worker="$worker" --command "$remote"
