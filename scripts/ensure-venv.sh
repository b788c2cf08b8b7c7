# Sourced by demo.sh and test.sh: make .venv and install the project when pyproject.toml changed.
command -v git >/dev/null || { echo "error: git is required (apt-get install git)" >&2; exit 2; }
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "error: Python >= 3.11 is required (found $("$PY" --version 2>&1))" >&2; exit 2; }
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.reconciler-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "installing reconciler and its dependencies into .venv ..." >&2
  # The distribution was called "reconciler" before it became reconciler-gitops (PyPI's
  # "reconciler" is another project): an old install would keep owning the import package.
  if .venv/bin/pip show -q reconciler >/dev/null 2>&1; then .venv/bin/pip uninstall -q -y reconciler >/dev/null; fi
  if ! .venv/bin/pip install -q -e '.[test]' >.venv/install.log 2>&1; then
    cat .venv/install.log >&2
    echo "error: installing into .venv failed (log above, and in .venv/install.log)" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
