#!/bin/bash
# ctest `models` (tests/models/CMakeLists.txt): builds or reuses the venv (setup_venv.sh), then runs
# the real-model corpus (run_models.py) against the built onnxrun/onnxtrain.
#   tests/models/run.sh BUILD_DIR [BIN_DIR] [run_models.py options, e.g. --only resnet]
set -euo pipefail
build=$(cd "${1:?usage: run.sh BUILD_DIR [BIN_DIR] [options]}" && pwd)
bin=${2:-$build/tools}
here=$(cd "$(dirname "$0")" && pwd)
"$here/setup_venv.sh" "$build/models-venv"
exec "$build/models-venv/bin/python" "$here/run_models.py" --bin "$bin" --work "$build/models-work" "${@:3}"
