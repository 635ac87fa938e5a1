#!/bin/bash
# ctest interop_* (tests/models/CMakeLists.txt): the corpus venv (setup_venv.sh, reused when it
# imports everything), then one check of tests/models/interop.py.
#   tests/models/interop.sh BUILD_DIR BIN_DIR tensorboard|onnxruntime
set -euo pipefail
build=$(cd "${1:?usage: interop.sh BUILD_DIR BIN_DIR CHECK}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
"$here/setup_venv.sh" "$build/models-venv"
exec "$build/models-venv/bin/python" "$here/interop.py" "${3:?}" --bin "${2:?}" --work "$build/interop-$3"
