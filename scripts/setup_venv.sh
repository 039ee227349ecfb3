#!/bin/sh
# Create the virtual environment and install the pinned dependencies into it; `make` calls this
# when the requirements (or TORCH) changed since the last install. See docs/install.md.
#   usage: setup_venv.sh PYTHON VENV TORCH [TORCH_INDEX]
#   TORCH: auto (a torch PYTHON already imports is kept; else the CUDA build where an NVIDIA
#          driver is found, the CPU build where not), cpu, cuda, or keep (a cluster's module).
set -eu
python=$1 venv=$2 choice=$3 index=${4:-}

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    echo "error: $python is not Python 3.10 or newer; pass PYTHON=python3.11 (or another)" >&2
    exit 2
fi
if [ "$choice" = auto ]; then
    if "$python" -c 'import torch' 2>/dev/null; then
        choice=keep
    elif command -v nvidia-smi >/dev/null 2>&1 || [ -e /proc/driver/nvidia/version ]; then
        choice=cuda
    else
        choice=cpu
    fi
fi
case $choice in
    cpu|cuda|keep) ;;
    *) echo "error: TORCH=$choice: use auto, cpu, cuda or keep" >&2; exit 2 ;;
esac

# A venv made for another choice (keep sees the system's packages, the others do not) is remade.
if [ -f "$venv/.torch-choice" ] && [ "$(cat "$venv/.torch-choice")" != "$choice" ]; then
    rm -rf "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
    echo "creating $venv (torch: $choice)"
    if [ "$choice" = keep ]; then
        "$python" -m venv --system-site-packages "$venv"
    else
        "$python" -m venv "$venv"
    fi
fi
echo "$choice" > "$venv/.torch-choice"
pip="$venv/bin/python -m pip install --quiet --disable-pip-version-check"

torch_pin=$(grep '^torch' requirements.txt)
case $choice in
    # PyPI's Linux wheel of the pin is the CUDA build; the CPU build lives on PyTorch's CPU index.
    cpu) $pip "$torch_pin" --index-url "${index:-https://download.pytorch.org/whl/cpu}" ;;
    cuda) if [ -n "$index" ]; then $pip "$torch_pin" --index-url "$index"; else $pip "$torch_pin"; fi ;;
    keep) "$venv/bin/python" -c 'import torch; print("keeping torch", torch.__version__)' ;;
esac
if [ "$choice" = keep ]; then
    $pip -r requirements-without-torch.txt
else
    $pip -r requirements.txt
fi
echo "installed into $venv; 'make train' and 'make test' use it"
