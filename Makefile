VENV   ?= .venv
PY     := $(VENV)/bin/python
export BERTKIT_DATA ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data),)

.PHONY: setup test test-pythons demo bench clean docs

$(VENV)/.installed: pyproject.toml
	python3.11 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned: an unpinned torch would pull a multi-GB CUDA build
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

test: setup
	$(PY) -m pytest -n 2 -q

# bertkit's wheel in a fresh venv per interpreter (3.11-3.13): the smoke set where a torch wheel is at
# hand, else the torch-free checks (scripts/test_pythons.sh says how torch is chosen)
test-pythons:
	bash scripts/test_pythons.sh

demo: setup
	@if [ -z "$$BERTKIT_DATA" ]; then \
	  echo "No data: set BERTKIT_DATA (or pass --data-dir) to a data folder laid out as docs/quickstart.md describes."; exit 2; fi
	$(VENV)/bin/bertkit reproduce --budget demo --data-dir "$$BERTKIT_DATA" --output runs/demo

bench: setup
	$(PY) benchmarks/run_all.py

# The documentation site into site/ (a warning or a broken link fails it); installs the docs extra if missing.
docs: setup
	@$(PY) -c "import mkdocs, material, mkdocstrings_handlers.python" 2>/dev/null || $(PY) -m pip install --quiet -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) runs
