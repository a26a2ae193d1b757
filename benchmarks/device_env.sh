# Sourced by the device scripts: run from the source tree, with nvmath-python installed from the
# carried .whl folder when there is one (the GPU machine has no network).
export PYTHONPATH=src PYTHONUNBUFFERED=1  # set XPURUNTIME_COMMIT in the command: the copy here has no trustworthy .git
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:src
fi
