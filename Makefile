# The two commands a newcomer needs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench venv clean

$(BIN)/duetime: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(BIN)/duetime

venv: $(BIN)/duetime

demo: venv
	$(BIN)/duetime demo

test: venv
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .

bench: venv
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) *.egg-info
