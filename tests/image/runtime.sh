# Sourced by tests/image/run and tests/image/compose: choose_runtime BASE_IMAGE SCRATCH sets
# the array `runtime` to podman's arguments for an OCI runtime that can start containers here.
# Where the OCI runtime may not set rlimits (inside some VMs and containers, podman's default
# RLIMIT_NPROC/NOFILE are refused), it is a wrapper around runc that leaves the host's limits.
choose_runtime() {
  local base=$1 scratch=$2
  runtime=()
  if [ -n "${EXECBOX_PODMAN_RUNTIME:-}" ]; then
    runtime=(--runtime "$EXECBOX_PODMAN_RUNTIME")
    return
  fi
  podman run --rm "$base" true >/dev/null 2>&1 && return
  local real
  real="$(command -v runc || true)"
  [ -n "$real" ] || { echo "podman cannot start a container here; install runc" >&2; exit 2; }
  cat > "$scratch/runtime" <<WRAP
#!/bin/sh
# podman's OCI runtime without the rlimits this machine refuses (tests/image/runtime.sh).
prev=""
for a in "\$@"; do
  case "\$prev" in
    --bundle|-b) "$python" "$repo/tests/image/norlimits.py" "\$a/config.json" ;;
    --process|-p) "$python" "$repo/tests/image/norlimits.py" "\$a" ;;
  esac
  prev="\$a"
done
exec "$real" "\$@"
WRAP
  chmod +x "$scratch/runtime"
  runtime=(--runtime "$scratch/runtime")
  podman "${runtime[@]}" run --rm "$base" true >/dev/null || {
    echo "podman cannot start a container here" >&2; exit 2; }
  echo "this machine refuses the runtime's rlimits: running runc without them"
}
