#!/usr/bin/env bash
# Create or reuse .venv/ and install the whole stack, idempotently.
#
# Why a script and not a requirements file: mmcv 2.1.0 has no wheel for torch 2.14, so it is built from the
# PyPI sdist with ops (20-25 min on 2 cores) and the wheel is cached outside the clone, keyed by torch and
# Python version (pip's own wheel cache ignores the torch version). A stamp makes a second run take seconds.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON_BIN="${PYTHON:-python3.11}"
TORCH_VERSION=2.14.1
TORCHVISION_VERSION=0.29.1
MMCV_VERSION=2.1.0
STACK=(
  "mmengine==0.10.7" "mmdet==3.3.0" "mmsegmentation==1.2.2" "mmpretrain==1.2.0"
  "ftfy" "regex" "timm" "pycocotools" "pytest" "pytest-xdist" "hypothesis" "ruff" "safetensors" "onnx" "onnxruntime"
  "onnxscript" "matplotlib"
)
CACHE="${CPVT_CACHE_DIR:-$HOME/.cache/cpvt_backbones}"

say() { printf '[env] %s\n' "$*"; }

stamp_of() {
  # Everything that decides the environment's content: this script and the package metadata.
  cat "$ROOT/tools/setup_env.sh" "$ROOT/pyproject.toml" 2>/dev/null | sha256sum | cut -d' ' -f1
}

if [ ! -x "$VENV/bin/python" ]; then
  command -v "$PYTHON_BIN" >/dev/null || PYTHON_BIN=python3
  say "creating $VENV with $($PYTHON_BIN --version)"
  "$PYTHON_BIN" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)

# Fashion-MNIST, the resolution studies' images, from Debian's package (needs root and apt-get; without them the
# studies say how to get it).
if [ ! -d /usr/share/datasets/fashion-mnist ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  say "installing Debian's dataset-fashion-mnist"
  apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1; } \
    || say "could not install dataset-fashion-mnist (the resolution studies need it)"
fi

STAMP="$VENV/.cpvt_env_stamp"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(stamp_of)" ] \
   && "$PY" -c "import torch, mmcv.ops, mmdet, mmseg, mmpretrain, timm, openvino, nncf, cpvt_backbones" 2>/dev/null; then
  say "up to date ($VENV)"
  exit 0
fi

installed() {  # installed NAME VERSION -> 0 if exactly that version is installed
  "$PY" - "$1" "$2" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if version(sys.argv[1]).split('+')[0] == sys.argv[2] else 1)
EOF
}

# torch 2.14 declares setuptools>=77, which has no pkg_resources; mmcv's setup.py and mmengine's `mmdet::`
# config bases need it. Only torch.utils.cpp_extension uses setuptools at run time, so we pin it back down
# after every install that may have raised it (pip then only warns).
pin_setuptools() { "${PIP[@]}" install -q "setuptools<70" 2>&1 | grep -v "incompatible\|dependency conflicts\|dependency resolver" || true; }

say "build tools"
"${PIP[@]}" install -q wheel ninja psutil packaging "numpy<2.5"

if installed torch "$TORCH_VERSION" && installed torchvision "$TORCHVISION_VERSION"; then
  say "torch $TORCH_VERSION + torchvision $TORCHVISION_VERSION present"
else
  say "installing torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION"
  "${PIP[@]}" install "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
fi
pin_setuptools

PYTAG="$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
TORCHTAG="$("$PY" -c 'import torch; print(torch.__version__.replace("+", "_"))')"
WHEEL_DIR="$CACHE/mmcv-$MMCV_VERSION-torch$TORCHTAG-$PYTAG"

if ! ls "$WHEEL_DIR"/mmcv-*.whl >/dev/null 2>&1; then
  say "building mmcv $MMCV_VERSION with ops for torch $TORCHTAG / $PYTAG (20-25 min on 2 cores, cached in $WHEEL_DIR)"
  BUILD="$(mktemp -d)"
  trap 'rm -rf "$BUILD"' EXIT
  "${PIP[@]}" download -q --no-deps --no-binary :all: "mmcv==$MMCV_VERSION" -d "$BUILD"
  tar -xzf "$BUILD"/mmcv-"$MMCV_VERSION".tar.gz -C "$BUILD"
  # torch >= 2.14 headers need C++20; mmcv's setup.py hard-codes C++17.
  sed -i 's/-std=c++17/-std=c++20/g' "$BUILD/mmcv-$MMCV_VERSION/setup.py"
  (cd "$BUILD/mmcv-$MMCV_VERSION" && MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-2}" \
    "${PIP[@]}" wheel --no-build-isolation --no-deps -w "$BUILD/wheel" .)
  mkdir -p "$WHEEL_DIR"
  cp "$BUILD"/wheel/mmcv-*.whl "$WHEEL_DIR/"
fi
MMCV_WHEEL="$(ls "$WHEEL_DIR"/mmcv-*.whl | head -n 1)"

say "installing mmcv (cached wheel), the OpenMMLab stack and test tools"
"${PIP[@]}" install -q "$MMCV_WHEEL" "${STACK[@]}" "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
pin_setuptools

say "installing cpvt_backbones (editable) with its OpenVINO extra (openvino, nncf)"
"${PIP[@]}" install -q --no-build-isolation -e "$ROOT[openvino]"
pin_setuptools

"$PY" -c "import torch, mmcv.ops, mmdet, mmseg, mmpretrain, timm, cpvt_backbones; \
print('[env] torch', torch.__version__, '| mmcv', mmcv.__version__, '| mmdet', mmdet.__version__, \
'| mmseg', mmseg.__version__, '| mmpretrain', mmpretrain.__version__, '| timm', timm.__version__)"
stamp_of > "$STAMP"
say "ready: $VENV"
