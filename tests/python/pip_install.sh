#!/bin/bash
# `pip install .` end to end (issue #21): builds and installs the package from this checkout with
# scikit-build-core (pyproject.toml; its build folder BUILD_DIR/wheel, through ccache when it is
# installed) into a fresh venv, then runs the Python API suite (tests/python) against the
# installed package: not PYTHONPATH, not the source tree.
#   tests/python/pip_install.sh BUILD_DIR     (BUILD_DIR/tools holds onnxzoo for the fixtures)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: pip_install.sh BUILD_DIR}" && pwd)
venv="$build/pip-venv"
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check scikit-build-core pybind11 numpy pytest \
  onnxruntime
options=(-C build-dir="$build/wheel")
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
  for lang in CXX C CUDA; do options+=(-C "cmake.define.CMAKE_${lang}_COMPILER_LAUNCHER=ccache"); done
fi
start=$SECONDS
(cd "$root" && "$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation . \
  "${options[@]}")
echo "pip install .: $((SECONDS - start)) s"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$venv/bin/python" -c "
import onnxtrain
assert '/site-packages/onnxtrain/' in onnxtrain.__file__, onnxtrain.__file__
print('import onnxtrain:', onnxtrain.__file__)"
ONNXTRAIN_BIN="$build/tools" "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/python"
