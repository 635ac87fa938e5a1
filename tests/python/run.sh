#!/bin/bash
# ctest python_api (tests/python/CMakeLists.txt): the corpus venv (tests/models/setup_venv.sh,
# reused when it imports everything), then pytest over tests/python with the built module.
#   tests/python/run.sh BUILD_DIR BIN_DIR
set -euo pipefail
build=$(cd "${1:?usage: run.sh BUILD_DIR BIN_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
"$here/../models/setup_venv.sh" "$build/models-venv"
export PYTHONPATH="$build/python" ONNXTRAIN_BIN="${2:?}"
exec "$build/models-venv/bin/python" -m pytest -q -p no:cacheprovider "$here"
