#!/bin/bash
# The ONNXTRAIN_CUDA switch, tested both ways: AUTO finds a toolkit when one exists and stays
# off without one, OFF never enables it, ON without a toolkit fails configuration clearly.
set -u
src="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
passes=0
configure() {  # name, extra args...
  local name=$1; shift
  env PATH=/usr/bin:/bin cmake -S "$src" -B "$work/$name" -DONNXTRAIN_TESTS=OFF "$@" >"$work/$name.log" 2>&1
}
expect() {  # description, condition
  if eval "$2"; then echo "ok: $1"; passes=$((passes + 1)); else echo "FAIL: $1"; fails=$((fails + 1)); fi
}
configure off -DONNXTRAIN_CUDA=OFF
expect "OFF configures without CUDA" "grep -q 'CUDA backend OFF' $work/off.log"
configure none -DONNXTRAIN_CUDA=AUTO -DONNXTRAIN_CUDA_ROOT=$work/no-cuda
expect "AUTO without a toolkit configures without CUDA" "grep -q 'CUDA backend OFF' $work/none.log"
configure req -DONNXTRAIN_CUDA=ON -DONNXTRAIN_CUDA_ROOT=$work/no-cuda
req_rc=$?
expect "ON without a toolkit fails" "[ $req_rc -ne 0 ] && grep -q 'ONNXTRAIN_CUDA=ON but no CUDA compiler' $work/req.log"
if [ -x /usr/local/cuda/bin/nvcc ]; then
  configure auto -DONNXTRAIN_CUDA=AUTO
  expect "AUTO with /usr/local/cuda enables CUDA" "grep -q 'CUDA backend ON' $work/auto.log"
else
  echo "skip: no /usr/local/cuda/bin/nvcc on this machine"
fi
echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
