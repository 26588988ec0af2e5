# Source on the GPU device machine, from the repository root: `. benchmarks/gpu/setup.sh || exit 1`
#
# The device image has torch (CUDA), lightning, scipy, pandas, opencv ... but not monai, kornia,
# albumentations, pyod, hydra, nibabel, pydantic: those travel as wheels in .whl/ (carry: [".whl"]),
# downloaded here with the versions of .venv (see the README of the device tool). wandb stays behind:
# robusttrain imports it lazily, only for logger=wandb and the W&B tests. Data, when needed, travels
# as .gpudata/ (carry it too; built by benchmarks/gpu/pack.py) and is read with
# data.root=.gpudata/polyp_256/kvasir_seg.
if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "setup.sh: no wheels in $PWD/.whl (name .whl in the run's carry)" >&2
    return 1 2>/dev/null || exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "setup.sh: installing .whl/*.whl into /tmp/site failed" >&2; return 1 2>/dev/null || exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 WANDB_MODE=offline
