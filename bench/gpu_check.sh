#!/usr/bin/env bash
# The CUDA proof (issue 28): run on a machine with an NVIDIA GPU, from the repository root.
#
#     bash bench/gpu_check.sh [STAGE ...]        # no STAGE: every stage, in this order
#
# Stages (each under its own timeout; each writes one file $OUT/<stage>.txt, the markdown of a
# benchmark appended to its log; $OUT/summary.txt gets one line per stage: rc and seconds):
#   env         nvidia-smi (GPU name, driver), Python, torch, the packages used
#   tests       pytest -m gpu: every GPU-marked test (tests/gpu/*, the CUDA cases elsewhere),
#               the field-report scenarios (tests/gpu/test_field_reports.py) among them
#   cuda_files  the rest of the suite's CUDA-relevant files, CUDA visible (tripwire on)
#   diag        bench/gpu_diag.py: does a CPU optimizer step initialise CUDA; DQN graphed vs eager
#   batched     bench/batched.py --device cuda
#   updates     bench/updates.py --device cuda
#   e2e         bench/gpu_e2e.py --device cuda (SAC, TD3, PPO on MuJoCo, end to end)
#   rerun       what failed in the first runs, after the fixes (the graphed-update tests, ...)
#   offline_files  tests/offline (IQL, TD3+BC, Minari datasets), CUDA visible (tripwire on)
#   offline     bench/offline_gpu.py --device cuda: IQL's and TD3+BC's gradient steps/s and host
#               waits, eager and graphed (issue 26)
# Time limits: TESTS_S (tests, cuda_files, offline_files), UPDATES_S, E2E_S, RERUN_S, OFFLINE_S (s);
# UPDATES_ARGS, E2E_ARGS: extra arguments.
# One command may run 10 minutes and a task gets 15 minutes of GPU time in all, so run it as two
# calls: `bash bench/gpu_check.sh env tests+cuda_files+diag batched` (~4 min on an H100 with 16
# cores), then `UPDATES_S=200 E2E_S=300 bash bench/gpu_check.sh updates e2e` (~8.5 min).
# Two stage groups run side by side where they do not share the GPU's attention: `tests` and
# `cuda_files` (the latter never touches CUDA: the tripwire is on).
#
# What the GPU image lacks travels as wheels in .whl/ (gymnasium, farama-notifications, lz4,
# zstandard, mujoco and its needs; made here with `pip download`, see bench/results/gpu.md);
# they are installed into /tmp/site and the checkout goes on PYTHONPATH, no install of rlstash.
set -u
OUT=${OUT:-$PWD/bench/.work/gpu_out}
mkdir -p "$OUT" /tmp/gpu
export PYTHONUNBUFFERED=1 MUJOCO_GL=${MUJOCO_GL:-disable}  # no rendering here: no EGL libraries needed
export JAX_PLATFORMS=cpu XLA_PYTHON_CLIENT_PREALLOCATE=false  # Minari's DataCollector imports jax
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
PY=${PY:-python3}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1 && [ ! -e /tmp/site/.done ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && touch /tmp/site/.done
fi

CUDA_FILES=(
    tests/test_device.py tests/test_tripwire.py tests/test_memory.py tests/test_replay.py
    tests/test_tiered.py tests/test_cli.py tests/agents/test_compiled.py
    tests/agents/test_old_checkpoints.py tests/agents/test_device_constants.py tests/agents/test_flat.py
    tests/faults/test_batched_contract.py
    tests/faults/test_finite.py tests/envs/test_batched_envs.py tests/envs/test_workers.py
    tests/collect/test_sync.py tests/collect/test_async.py tests/marl/test_mappo_compiled.py
    tests/marl/test_qmix.py
)

stage() {  # stage NAME SECONDS CMD...: CMD's output to $OUT/NAME.txt, a line to summary.txt
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    echo "== $name: $* (limit ${limit}s)" | tee -a "$OUT/summary.txt"
    timeout -k 15 "$limit" "$@" >>"$OUT/$name.txt" 2>&1
    rc=$?
    echo "== $name: rc $rc in $(($(date +%s) - start)) s" | tee -a "$OUT/summary.txt"
    tail -n 3 "$OUT/$name.txt" | sed "s/^/   $name| /" | tee -a "$OUT/summary.txt"
    return 0
}

bench() {  # bench NAME SECONDS SCRIPT ARGS...: the script's markdown appended to its log
    local name=$1 limit=$2
    shift 2
    stage "$name" "$limit" "$PY" "$@" --out "/tmp/gpu/$name.md"
    [ -f "/tmp/gpu/$name.md" ] && { echo; echo "---- $name.md"; cat "/tmp/gpu/$name.md"; } >>"$OUT/$name.txt"
    return 0
}

env_info() {
    nvidia-smi
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    "$PY" - <<'EOF'
import importlib, platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0))
for name in ["numpy", "gymnasium", "mujoco", "lz4", "zstandard", "cloudpickle", "psutil", "pytest"]:
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as exc:  # noqa: BLE001
        print(name, "MISSING", exc)
import rlstash
print("rlstash", rlstash.__file__)
EOF
    nproc
}

run_stage() {
    case $1 in
    env) stage env 60 bash -c env_info ;;
    tests) stage tests "${TESTS_S:-240}" "$PY" -m pytest -m gpu -q -rfEs -p no:cacheprovider -n 6 --timeout 200 \
        $(grep -rlE "mark\.gpu|pytestmark = pytest\.mark\.gpu" tests --include="*.py" | sort) ;;
    cuda_files) stage cuda_files "${TESTS_S:-240}" "$PY" -m pytest -m "not gpu" -q -rfE -p no:cacheprovider -n 12 \
        --timeout 200 "${CUDA_FILES[@]}" ;;
    seeds) stage seeds 120 "$PY" -m pytest -q -rA -p no:cacheprovider tests/gpu/test_field_reports.py ;;
    diag) stage diag 150 "$PY" bench/gpu_diag.py ;;
    batched) bench batched 240 bench/batched.py --device cuda --max-seconds 220 ;;
    rerun) stage rerun "${RERUN_S:-90}" "$PY" -m pytest -q -rfEs -p no:cacheprovider -n 8 --timeout 80 \
        tests/gpu/test_compiled_cuda.py tests/agents/test_compiled.py \
        tests/agents/test_device_constants.py tests/test_tripwire.py \
        "tests/test_cli.py::test_plan_keeps_its_old_flag_names_with_a_deprecation_warning" ;;
    updates) bench updates "${UPDATES_S:-330}" bench/updates.py --device cuda \
        --budget "$((${UPDATES_S:-330} - 20))" ${UPDATES_ARGS:-} ;;
    e2e) bench e2e "${E2E_S:-330}" bench/gpu_e2e.py --device cuda --budget "$((${E2E_S:-330} - 25))" \
        ${E2E_ARGS:-} ;;
    offline_files) stage offline_files "${TESTS_S:-240}" "$PY" -m pytest -m "not gpu" -q -rfEs -p no:cacheprovider \
        -n 8 --timeout 200 tests/offline ;;
    offline) bench offline "${OFFLINE_S:-120}" bench/offline_gpu.py --device cuda ;;
    *) echo "unknown stage $1" | tee -a "$OUT/summary.txt" ;;
    esac
}

export PY
export -f env_info
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(env tests+cuda_files+diag batched updates e2e)
for s in "${STAGES[@]}"; do
    if [[ $s == *+* ]]; then  # side by side
        IFS=+ read -r -a pair <<<"$s"
        for p in "${pair[@]}"; do run_stage "$p" & done
        wait
    else
        run_stage "$s"
    fi
done
echo "== done" | tee -a "$OUT/summary.txt"
