#!/usr/bin/env bash
# Create or reuse a virtual environment with one of the supported stacks, idempotently.
#
#   STACK=default  (.venv)          torch 2.14.1, mmcv 2.1.0 built from source, mmengine 0.10.7, mmdet 3.3.0,
#                                   mmsegmentation 1.2.2, mmpretrain 1.2.0, OpenVINO + NNCF
#   STACK=upstream (.venv-upstream) torch 2.1.2, numpy < 2, mmcv 2.1.0 built from source (OpenMMLab's own
#                                   wheels are CUDA builds for download.openmmlab.com, not on PyPI), the same
#                                   mmengine/mmdet/mmseg/mmpretrain; no OpenVINO (its conversion needs torch >= 2.6)
#   STACK=onedl    (.venv-onedl)    torch 2.15.0, the OneDL forks' newest releases (onedl-mmcv built from its sdist)
#   STACK=core     (.venv-core)     torch 2.1.2, numpy < 2 and the test tools, no OpenMMLab: the core on the
#                                   oldest supported torch
#   STACK=ecosystems (.venv-ecosystems) torch 2.14.1, transformers 5 and segmentation-models-pytorch with the test
#                                   tools, no OpenMMLab: mmpretrain 1.2 cannot be imported beside transformers 5
#                                   (its BLIP models import names transformers 5 removed), so they live apart
#
# PYTHON (default python3.11) is the interpreter a new environment is made with; VENV_DIR (relative to the repo
# root) overrides the stack's folder, so that one stack on another Python lives beside the 3.11 one
# (`make test STACK=ecosystems PYTHON=python3.12` sets both).
#
# Why a script and not a requirements file: mmcv has no wheel on PyPI for these torch builds, so it is built from
# the sdist with ops (20-25 min on 2 cores) and the wheel is cached outside the clone, keyed by package, torch and
# Python version (pip's own wheel cache ignores the torch version). Every install of a stack passes that stack's
# own constraints (torch, torchvision, numpy), which replace any machine-wide pip constraint, so that nothing
# moves the stack's torch. A stamp makes a second run take seconds.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK="${STACK:-default}"
PYTHON_BIN="${PYTHON:-python3.11}"
TOOLS=("pytest" "pytest-xdist" "hypothesis" "ruff" "timm" "safetensors" "onnx" "onnxruntime" "onnxscript" "matplotlib"
       "vermin")
OPENMMLAB=("mmengine==0.10.7" "mmdet==3.3.0" "mmsegmentation==1.2.2" "mmpretrain==1.2.0")
ONEDL=("onedl-mmengine==0.10.12" "onedl-mmdetection==3.5.1" "onedl-mmsegmentation==1.4.2" "onedl-mmpretrain==1.3.6")
ECOSYSTEMS=()
MMCV=(mmcv 2.1.0)
OPENVINO=1
SETUPTOOLS="setuptools<70"
CHECK="import torch, mmcv.ops, mmdet, mmseg, mmpretrain, timm, openvino, nncf, cpvt_backbones"
case "$STACK" in
  default)  VENV="$ROOT/.venv"; PINS=("torch==2.14.1" "torchvision==0.29.1" "numpy<2.5"); STACK_PKGS=("${OPENMMLAB[@]}") ;;
  upstream) VENV="$ROOT/.venv-upstream"; PINS=("torch==2.1.2" "torchvision==0.16.2" "numpy<2"); STACK_PKGS=("${OPENMMLAB[@]}")
            OPENVINO=0; CHECK="import torch, mmcv.ops, mmdet, mmseg, mmpretrain, timm, cpvt_backbones" ;;
  onedl)    VENV="$ROOT/.venv-onedl"; PINS=("torch==2.15.0" "torchvision==0.29.2" "numpy<2.5"); STACK_PKGS=("${ONEDL[@]}")
            MMCV=(onedl-mmcv 2.3.6); SETUPTOOLS="setuptools>=80" ;;
  core)     VENV="$ROOT/.venv-core"; PINS=("torch==2.1.2" "torchvision==0.16.2" "numpy<2"); STACK_PKGS=(); MMCV=()
            OPENVINO=0; CHECK="import torch, timm, cpvt_backbones" ;;
  ecosystems) VENV="$ROOT/.venv-ecosystems"; PINS=("torch==2.14.1" "torchvision==0.29.1" "numpy<2.5"); STACK_PKGS=()
            MMCV=(); OPENVINO=0; ECOSYSTEMS=("transformers>=5.20,<6" "segmentation-models-pytorch>=0.5,<0.7" scipy)
            CHECK="import torch, timm, transformers, segmentation_models_pytorch, cpvt_backbones" ;;
  *) echo "[env] unknown STACK=$STACK (default, upstream, onedl, core or ecosystems)" >&2; exit 2 ;;
esac
[ -n "${VENV_DIR:-}" ] && VENV="$ROOT/$VENV_DIR"
CACHE="${CPVT_CACHE_DIR:-$HOME/.cache/cpvt_backbones}"

say() { printf '[env] %s\n' "$*"; }

stamp_of() {
  # Everything that decides the environment's content: this script, the stack and the package metadata.
  { echo "$STACK"; cat "$ROOT/tools/setup_env.sh" "$ROOT/pyproject.toml" 2>/dev/null; } | sha256sum | cut -d' ' -f1
}

if [ ! -x "$VENV/bin/python" ]; then
  # A new environment takes 5-7 GiB (PyPI's torch wheels bring CUDA libraries); a full disk would stop pip halfway.
  NEED_GIB="${CPVT_ENV_NEED_GIB:-8}"
  FREE_GIB=$(( $(df -Pk "$ROOT" | awk 'NR == 2 {print $4}') / 1048576 ))
  if [ "$FREE_GIB" -lt "$NEED_GIB" ]; then
    echo "[env] $VENV needs about $NEED_GIB GiB free on the disk of $ROOT, found $FREE_GIB GiB:" \
      "free some space (old .venv-* folders, /tmp/pytest-of-$(id -un)) or set CPVT_ENV_NEED_GIB" >&2
    exit 2
  fi
  if ! "$PYTHON_BIN" -c '' 2>/dev/null; then
    [ -n "${PYTHON:-}" ] && { echo "[env] PYTHON=$PYTHON does not run (a pyenv shim of an inactive version? give" \
                                   "its path, e.g. PYTHON=\$(pyenv root)/versions/3.12.1/bin/python3.12)" >&2; exit 2; }
    PYTHON_BIN=python3
  fi
  say "creating $VENV with $($PYTHON_BIN --version) for STACK=$STACK"
  "$PYTHON_BIN" -m venv "$VENV"
fi
PY="$VENV/bin/python"
CONSTRAINTS="$VENV/cpvt_constraints.txt"
printf '%s\n' "${PINS[@]}" > "$CONSTRAINTS"
# PIP_CONSTRAINT replaces a machine-wide constraint file (pip's `constraint` setting) with the stack's own.
PIP=(env PIP_CONSTRAINT="$CONSTRAINTS" "$PY" -m pip --disable-pip-version-check)
INSTALL=("${PIP[@]}" install)
# Fashion-MNIST, the resolution studies' images, from Debian's package (needs root and apt-get; without them the
# studies say how to get it).
if [ ! -d /usr/share/datasets/fashion-mnist ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  say "installing Debian's dataset-fashion-mnist"
  apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1; } \
    || say "could not install dataset-fashion-mnist (the resolution studies need it)"
fi

STAMP="$VENV/.cpvt_env_stamp"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(stamp_of)" ] && "$PY" -c "$CHECK" 2>/dev/null; then
  say "up to date ($VENV)"
  exit 0
fi

# torch >= 2.14 declares setuptools>=77, which has no pkg_resources; mmcv 2.1.0's setup.py and mmengine 0.10.7's
# `mmdet::` config bases need it. Only torch.utils.cpp_extension uses setuptools at run time, so on those stacks we
# pin it back down after every install that may have raised it (pip then only warns). The OneDL packages use
# importlib.metadata instead, and onedl-mmcv's build needs setuptools >= 80.
pin_setuptools() { "${INSTALL[@]}" -q "$SETUPTOOLS" 2>&1 | grep -v "incompatible\|dependency conflicts\|dependency resolver" || true; }

say "build tools"
"${INSTALL[@]}" -q wheel ninja psutil packaging numpy

say "installing ${PINS[*]}"
"${INSTALL[@]}" -q "${PINS[@]}"
pin_setuptools

PYTAG="$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
TORCHTAG="$("$PY" -c 'import torch; print(torch.__version__.replace("+", "_"))')"
WHEELS=()
if [ "${#MMCV[@]}" -gt 0 ]; then
  DIST="${MMCV[0]}"; VERSION="${MMCV[1]}"
  WHEEL_DIR="$CACHE/$DIST-$VERSION-torch$TORCHTAG-$PYTAG"
  if ! ls "$WHEEL_DIR"/*.whl >/dev/null 2>&1; then
    say "building $DIST $VERSION with ops for torch $TORCHTAG / $PYTAG (20-25 min on 2 cores, cached in $WHEEL_DIR)"
    BUILD="$(mktemp -d)"
    trap 'rm -rf "$BUILD"' EXIT
    "${PIP[@]}" download -q --no-deps --no-binary :all: "$DIST==$VERSION" -d "$BUILD"
    tar -xzf "$BUILD"/*.tar.gz -C "$BUILD"
    SRC="$(find "$BUILD" -mindepth 1 -maxdepth 1 -type d | head -n 1)"
    # torch >= 2.10 headers need C++20; mmcv's setup.py hard-codes C++17 (which torch 2.1 builds with).
    if "$PY" -c 'import sys, torch; sys.exit(tuple(map(int, torch.__version__.split(".")[:2])) < (2, 10))'; then
      sed -i 's/-std=c++17/-std=c++20/g' "$SRC/setup.py"
    fi
    (cd "$SRC" && MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-2}" \
      "${PIP[@]}" wheel --no-build-isolation --no-deps -w "$BUILD/wheel" .)
    mkdir -p "$WHEEL_DIR"
    cp "$BUILD"/wheel/*.whl "$WHEEL_DIR/"
  fi
  WHEELS=("$(ls "$WHEEL_DIR"/*.whl | head -n 1)")
fi

say "installing ${WHEELS[*]:-no mmcv} ${STACK_PKGS[*]:-} and the test tools"
"${INSTALL[@]}" -q "${WHEELS[@]}" "${STACK_PKGS[@]}" ftfy regex pycocotools "${TOOLS[@]}" "${ECOSYSTEMS[@]}" \
  "${PINS[@]}"
pin_setuptools

EXTRA=""
[ "$OPENVINO" = 1 ] && EXTRA="[openvino]"
say "installing cpvt_backbones (editable)${EXTRA:+ with its OpenVINO extra (openvino, nncf)}"
"${INSTALL[@]}" -q --no-build-isolation -e "$ROOT$EXTRA"
pin_setuptools

"$PY" -c "$CHECK" && "$PY" -c "import importlib, torch
versions = ['torch ' + torch.__version__]
for name in ('mmcv', 'mmengine', 'mmdet', 'mmseg', 'mmpretrain', 'timm', 'transformers', 'segmentation_models_pytorch',
             'openvino', 'numpy'):
    try:
        versions.append(name + ' ' + importlib.import_module(name).__version__)
    except ImportError:
        pass
print('[env]', ' | '.join(versions))"
stamp_of > "$STAMP"
say "ready: $VENV"
