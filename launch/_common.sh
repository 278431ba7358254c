# Shared by the launch scripts (sourced, not run): the CLI to call and a config check.

# Sets the array `cli`: $SAGC_JAX if given, else the installed `sagc-jax`, else the module run
# by $PYTHON (default python3: images often have no `python`).
resolve_cli() {
  if [[ -n ${SAGC_JAX:-} ]]; then
    read -r -a cli <<<"$SAGC_JAX"
  elif command -v sagc-jax >/dev/null 2>&1; then
    cli=(sagc-jax)
  else
    cli=("${PYTHON:-python3}" -m sagc_jax.cli)
  fi
}

# require_config SCRIPT_NAME PATH: exit 2 with one line when the config file is missing.
require_config() {
  if [[ ! -f $2 ]]; then
    echo "$1: config file not found: $2" >&2
    exit 2
  fi
}
