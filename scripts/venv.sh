#!/usr/bin/env bash
# scripts/venv.sh - make the project's virtualenv ready (called by the Makefile after scripts/setup.sh).
#
#   scripts/venv.sh run    pgkb and what running it needs (`pip install -e .`): `make run`
#   scripts/venv.sh dev    the same plus the test/dev extras (`pip install -e '.[dev]'`: pytest, ruff,
#                          sqlfluff, mypy, sentence-transformers with torch): `make test`, `make check`
#
# A virtualenv that cannot be trusted is removed and made again, without asking:
#   - its python is missing or does not run;
#   - it was made by another interpreter than $PYTHON (e.g. python3 was upgraded or PYTHON changed);
#   - pip is missing from it (a venv made while python3-venv/ensurepip was absent);
#   - an earlier install did not finish (the marker .installing is still there).
# What was installed is recorded in .installed (the extras and a hash of pyproject.toml). When it
# already covers the request, nothing is installed and this takes well under a second; a `dev` venv
# also serves `run`. When pyproject.toml changed, the packages are installed again into the same venv.
#
# torch: the dev extras pin torch (pyproject.toml). It is installed first from the PyTorch CPU wheel
# index ($PGKB_TORCH_INDEX, default https://download.pytorch.org/whl/cpu; pip's find-links are searched
# too), because the default index's Linux wheel is the CUDA build with several GB of NVIDIA libraries.
# If that index cannot be reached, torch comes from the default index like everything else.
#
# Environment: PYTHON (default python3), VENV (default .venv), PGKB_TORCH_INDEX (empty: skip that step).
set -euo pipefail
cd "$(dirname "$0")/.."

readonly PYTHON="${PYTHON:-python3}"
readonly VENV="${VENV:-.venv}"
readonly TORCH_INDEX="${PGKB_TORCH_INDEX-https://download.pytorch.org/whl/cpu}"
readonly STAMP="$VENV/.installed"
readonly MARKER="$VENV/.installing"
readonly PIP_OPTS=(-q --disable-pip-version-check)

log() { printf 'setup: %s\n' "$*"; }
die() {
    printf 'setup: ERROR: %s\n' "$*" >&2
    exit 1
}

want="${1:-}"
case "$want" in
run | dev) ;;
*) die "usage: scripts/venv.sh run|dev" ;;
esac

command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found: run scripts/setup.sh (make setup) first"
base="$("$PYTHON" -c 'import os, sys; print(os.path.realpath(sys.executable))')" ||
    die "$PYTHON does not run"
project_hash="$(sha256sum pyproject.toml | cut -d' ' -f1)"

# Why the existing venv cannot be used as it is (empty: it can).
broken_reason() {
    [[ -e "$VENV" ]] || return 0
    if [[ -e "$MARKER" ]]; then
        echo "an earlier install into it did not finish"
        return 0
    fi
    if ! "$VENV/bin/python" -c '' >/dev/null 2>&1; then
        echo "its python is missing or does not run"
        return 0
    fi
    # bin/python is a symlink to the interpreter that made the venv
    local made_by
    made_by="$(readlink -f "$VENV/bin/python")"
    if [[ "$made_by" != "$base" ]]; then
        echo "it was made by $made_by, not by $PYTHON ($base)"
    elif ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
        echo "pip is missing from it"
    fi
}

# The extras the venv holds for the current pyproject.toml: dev, run, or nothing.
installed_extras() {
    [[ -f "$STAMP" ]] || return 0
    local extras="" hash=""
    read -r extras hash <"$STAMP" || true
    [[ "$hash" == "$project_hash" ]] && printf '%s' "$extras"
    return 0
}

reason="$(broken_reason)"
if [[ -z "$reason" && -d "$VENV" ]]; then
    have="$(installed_extras)"
    if [[ "$have" == dev || "$have" == "$want" ]]; then
        exit 0
    fi
fi

started=$SECONDS
if [[ -n "$reason" ]]; then
    log "$VENV cannot be used ($reason): removing it and making it again"
    rm -rf "$VENV"
fi
if [[ ! -d "$VENV" ]]; then
    log "creating $VENV with $PYTHON ($base)"
    "$PYTHON" -m venv "$VENV" || {
        rm -rf "$VENV"
        die "$PYTHON -m venv failed (on Debian/Ubuntu: apt-get install python3-venv, or run scripts/setup.sh)"
    }
    touch "$MARKER"
    "$VENV/bin/python" -m pip install "${PIP_OPTS[@]}" --upgrade pip
fi
touch "$MARKER"
rm -f "$STAMP"

if [[ "$want" == dev ]]; then
    torch_req="$(sed -n 's/^ *"\(torch==[^";]*\)".*/\1/p' pyproject.toml | head -n 1)"
    torch_have="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)"
    if [[ -n "$torch_req" && -n "$TORCH_INDEX" && "${torch_have%%+*}" != "${torch_req#torch==}" ]]; then
        log "installing $torch_req (CPU build) from $TORCH_INDEX"
        if ! "$VENV/bin/python" -m pip install "${PIP_OPTS[@]}" --index-url "$TORCH_INDEX" --retries 1 --timeout 30 \
            "$torch_req" 2>"$VENV/torch-index.log"; then
            if grep -q -E 'NameResolution|Failed to establish|ConnectTimeout|Network is unreachable' "$VENV/torch-index.log"; then
                why="the index cannot be reached"
            else
                why="$(grep -m1 '^ERROR' "$VENV/torch-index.log" | cut -c1-160)"
            fi
            log "could not get $torch_req from $TORCH_INDEX: ${why:-pip failed}"
            log "  it comes from the default index instead (on Linux x86_64 that is the CUDA build, several GB more)"
        fi
        rm -f "$VENV/torch-index.log"
    fi
    log "installing pgkb with the test/dev extras into $VENV (pip install -e '.[dev]')"
    "$VENV/bin/python" -m pip install "${PIP_OPTS[@]}" -e '.[dev]'
else
    log "installing pgkb into $VENV (pip install -e .)"
    "$VENV/bin/python" -m pip install "${PIP_OPTS[@]}" -e .
fi

printf '%s %s\n' "$want" "$project_hash" >"$STAMP"
rm -f "$MARKER"
log "$VENV ready for make $([[ $want == dev ]] && echo test || echo run) in $((SECONDS - started)) s ($(du -sh "$VENV" | cut -f1))"
