# Sourced by the device scripts: environment for a run on the lent GPU machine.
# PYTHONPATH: the repo, stk's sdist (.stk, carried, never committed) and the carried
# test wheels (.whl, installed into /tmp/site); $OUT: where results go.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.stk:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
