#!/usr/bin/env bash
# Read the Python packages (torch and its CUDA libraries) and the CUDA toolkit into the page cache before
# a timed pass. A fresh machine's first pass otherwise pays for cold files that a second pass finds
# cached: the input planner (a process importing torch) took 13 s in a first pass and 4.7 s in a second,
# and one tree's cold batch 219.7 s first against 179.3 s second (docs/benchmarks.md, tenth session).
# Usage: bash bench/gpu/warm_page_cache.sh   (prints the sizes read and the seconds it took; at most 90 s)
set -uo pipefail
PY=${PYTHON:-python3}
site=$("$PY" -c 'import site; print(site.getsitepackages()[0])')
cuda=$("$PY" -c 'from torch.utils.cpp_extension import CUDA_HOME; print(CUDA_HOME or "")')
dirs=("$site")
[ -n "$cuda" ] && dirs+=("$(readlink -f "$cuda")")
SECONDS=0
du -shL "${dirs[@]}" 2>/dev/null
timeout 90 bash -c 'find -L "$@" -type f -print0 | xargs -0 -P8 cat > /dev/null 2>&1' _ "${dirs[@]}"
"$PY" -c 'import torch; torch.zeros(1, device="cuda" if torch.cuda.is_available() else "cpu"); print("torch ready")'
echo "page cache warmed in ${SECONDS} s"
