#!/usr/bin/env bash
# make test-pythons: bertkit's wheel (not an editable install) in a fresh venv per interpreter, then
# scripts/python_smoke.py there.
#
# Interpreters: $PYTHONS (paths or names, space-separated), else python3.11 / 3.12 / 3.13 from PATH or
# pyenv's versions. torch per interpreter, smallest first: a wheel pip finds without an index (its
# find-links: a CPU build such as torch-2.13.0+cpu-cp311), or with TEST_PYTHONS_TORCH=registry the
# registry's build (on Linux the CUDA one: a ~530 MB wheel plus ~2.5 GB of NVIDIA libraries). Where
# neither: the dependencies but torch, and the torch-free checks (byte-compile, imports, --help).
# Exits 1 if any interpreter fails; missing interpreters are reported and skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=${TEST_PYTHONS_DIR:-${TMPDIR:-/tmp}/bertkit-pythons}
QUIET=--quiet
[ -z "${TEST_PYTHONS_VERBOSE:-}" ] || QUIET=--verbose

find_python() {  # $1 = 3.12: the interpreter's path, or nothing
    local found candidates=()
    found=$(command -v "python$1" 2>/dev/null) && candidates+=("$found")
    command -v pyenv >/dev/null 2>&1 && candidates+=("$(pyenv root)"/versions/"$1".*/bin/"python$1")
    for found in "${candidates[@]}"; do  # a pyenv shim on PATH may not run: the first that does
        "$found" -c pass >/dev/null 2>&1 && { echo "$found"; return; }
    done
}

if [ -n "${PYTHONS:-}" ]; then
    read -r -a interpreters <<<"$PYTHONS"
else
    interpreters=()
    for version in 3.11 3.12 3.13; do
        found=$(find_python "$version")
        if [ -n "$found" ]; then interpreters+=("$found"); else echo "test-pythons: python$version not found, skipped"; fi
    done
fi
[ ${#interpreters[@]} -gt 0 ] || { echo "test-pythons: no interpreter found"; exit 1; }

rm -rf "$WORK" && mkdir -p "$WORK/dist" || exit 1
passed=0 failed=0 summary=()
for interpreter in "${interpreters[@]}"; do
    start=$SECONDS
    version=$("$interpreter" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || { failed=$((failed + 1)); summary+=("$interpreter: not runnable"); continue; }
    venv="$WORK/venv-$version"
    pip() {  # the venv's pip, without the warning about each missing page of a local index
        "$venv/bin/python" -m pip $QUIET --disable-pip-version-check "$@" 2> >(grep -v "is neither a file nor a directory" >&2)
    }
    echo "== python $version ($interpreter)"
    mode=""
    torch_version() { "$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))'; }
    {
        "$interpreter" -m venv "$venv" &&
        pip install --upgrade pip &&
        # The wheel is pure Python: built once, installed everywhere.
        if ! ls "$WORK"/dist/bertkit-*.whl >/dev/null 2>&1; then
            pip wheel --no-deps -w "$WORK/dist" "$ROOT"
        fi &&
        wheel=$(ls "$WORK"/dist/bertkit-*.whl) &&
        if pip install --no-index --no-deps --only-binary :all: "torch>=2.6,<2.15" 2>/dev/null; then
            mode="torch $(torch_version) from a local wheel"
        elif [ "${TEST_PYTHONS_TORCH:-}" = registry ] && pip install "torch>=2.6,<2.15"; then
            mode="torch $(torch_version) from the registry"
        else
            mode="no torch wheel for python $version here (TEST_PYTHONS_TORCH=registry fetches the registry's)"
        fi &&
        if [ "${mode#torch }" != "$mode" ]; then
            pip install "$wheel"
        else
            # Every dependency but torch (from the wheel's METADATA), so that what runs without torch runs
            # and each pin resolves here; then bertkit itself.
            "$venv/bin/python" -c 'import email, sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
requires = email.message_from_bytes(wheel.read(metadata)).get_all("Requires-Dist") or []
print("\n".join(r for r in requires if "extra ==" not in r and not r.startswith("torch")))' "$wheel" >"$venv/requirements.txt" &&
            pip install -r "$venv/requirements.txt" &&
            pip install --no-deps "$wheel"
        fi
    } || { failed=$((failed + 1)); summary+=("python $version: install failed ($((SECONDS - start)) s)"); continue; }
    echo "   $mode"
    smoke=(scripts/python_smoke.py)
    [ "${mode#torch }" != "$mode" ] || smoke+=(--no-torch)
    # From outside the checkout, so that `import bertkit` can only be the installed wheel.
    if (cd "$WORK" && "$venv/bin/python" "$ROOT/${smoke[0]}" "${smoke[@]:1}"); then
        passed=$((passed + 1)); result=passed
    else
        failed=$((failed + 1)); result=FAILED
    fi
    what="smoke set"; [ "${mode#torch }" != "$mode" ] || what="torch-free checks"
    summary+=("python $version: $what $result ($((SECONDS - start)) s; $mode)")
done

echo "== test-pythons"
printf '   %s\n' "${summary[@]}"
echo "test-pythons: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
