#!/usr/bin/env bash
# Download, on a machine with the package registry, exactly the wheels the lent H200 machine
# lacks, so that `tools/gpu.sh` can install them there with no network (issue 35).
#
#   tools/prepare_gpu_wheels.sh [DEST]        # DEST default: .gpu_wheels/ (git-ignored)
#   CHECK=1 [CHECK_PYTHON=PY] tools/prepare_gpu_wheels.sh
#       also install them --no-index --no-deps --target into a scratch folder; with CHECK_PYTHON
#       (an interpreter holding the image's package versions), import every sagc_jax module
#       with that folder first on the path
#
# The image (Python 3.12 as `python3`; jax 0.11.2 + the CUDA 13 plugin, flax, optax,
# orbax-checkpoint, transformers 5.17, safetensors, tokenizers, pyarrow, matplotlib, tqdm,
# jinja2, pyyaml, absl-py, scipy) lacks what `sagc_jax` imports at module import time:
#   pydantic (+ pydantic-core, annotated-types, typing-inspection; pydantic 2.14 needs
#     typing-extensions >= 4.16, newer than the image may hold: shipped too, it is backward
#     compatible) -- the config schema, imported by every part through sagc.config;
#   grain (+ array-record, cloudpickle, portpicker; etils, protobuf and psutil come with
#     orbax-checkpoint) -- checkpoint.py and data/pipeline.py, i.e. the training run;
#   tensorboardX -- metrics.py (imported lazily, only when TensorBoard logging is on).
# The pins are the versions the shared venv runs the test suite with. Everything is
# `--no-deps --only-binary=:all:` for cp312 manylinux x86-64, about 6 MiB in all (the run tool
# carries at most 64 MiB with the working tree).
#
# Env: PIP [python3.12 -m pip if found, else python3 -m pip]  the pip that downloads (any
#      Python: --python-version picks the wheels); CHECK [0]; CHECK_PYTHON [unset].
set -euo pipefail

cd "$(dirname "$0")/.."
dest=${1:-.gpu_wheels}
if [[ -n ${PIP:-} ]]; then
  read -r -a pip <<<"$PIP"
elif command -v python3.12 >/dev/null 2>&1; then
  pip=(python3.12 -m pip)
else
  pip=(python3 -m pip)
fi

# name==version, one per line: what the H200 image is missing (see above).
WHEELS=(
  pydantic==2.14.4
  pydantic-core==2.50.5
  annotated-types==0.8.0
  typing-inspection==0.4.5
  typing-extensions==4.16.0
  grain==0.2.18
  array-record==0.8.6
  cloudpickle==3.1.3
  portpicker==1.6.0
  tensorboardX==2.6.5
)

mkdir -p "$dest"
rm -f "$dest"/*.whl
# manylinux_2_28 first (the image's glibc is newer); pip also takes the older manylinux tags
# listed after it, which is where pydantic-core and array-record publish.
"${pip[@]}" download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d "$dest" "${WHEELS[@]}"

n=$(find "$dest" -maxdepth 1 -name '*.whl' | wc -l)
if [[ $n -ne ${#WHEELS[@]} ]]; then
  echo "prepare_gpu_wheels: expected ${#WHEELS[@]} wheels in $dest, got $n" >&2
  exit 1
fi
du -ch "$dest"/*.whl | tail -1 | sed "s|total|$dest ($n wheels)|"

if [[ ${CHECK:-0} == 1 ]]; then
  scratch=$(mktemp -d)
  "${pip[@]}" install --no-index --no-deps --target "$scratch" "$dest"/*.whl >/dev/null
  echo "installed into $scratch: $(ls "$scratch" | grep -v -e dist-info -e __pycache__ | xargs)"
  if [[ -n ${CHECK_PYTHON:-} ]]; then
    # An interpreter set up like the image (Python 3.12, jax 0.11.2, transformers 5.17, no
    # pydantic / grain / tensorboardX): every sagc_jax module must import with the wheels.
    PYTHONPATH="$scratch:$PWD" JAX_PLATFORMS=cpu "$CHECK_PYTHON" - <<'PY'
import importlib, pkgutil, sys
import sagc_jax
bad = {}
for m in pkgutil.walk_packages(sagc_jax.__path__, "sagc_jax."):
    try:
        importlib.import_module(m.name)
    except Exception as e:
        bad[m.name] = f"{type(e).__name__}: {e}"
import jax, pydantic, grain, transformers
print(f"python {sys.version.split()[0]}, jax {jax.__version__}, transformers "
      f"{transformers.__version__}, pydantic {pydantic.__version__} from {pydantic.__file__}")
print("import failures:", bad or "none")
sys.exit(1 if bad else 0)
PY
  fi
fi
