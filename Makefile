# Every target installs what it needs into .venv itself, so a fresh clone needs only these.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: install run run-cluster test test-fast lint bench bench-smoke clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all,dev,bench]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	@command -v java >/dev/null 2>&1 || [ -n "$$JAVA_HOME" ] || { echo "make run: Spark needs Java 17. Install it: sudo apt-get install -y openjdk-17-jre-headless (Debian/Ubuntu), brew install openjdk@17 (macOS), sudo dnf install java-17-openjdk-headless (Fedora); or set JAVA_HOME" >&2; exit 1; }
	$(PY) -m homing --db $${HOMING_DB:-sqlite:///homing-pipeline.db} pipeline run --master '$(or $(MASTER),local[*])' $(RUN_ARGS)

# The pipeline on a Spark standalone cluster started here (a master and 2 workers, as a
# cluster is started), against PostgreSQL, with one executor JVM SIGKILLed mid-replace.
run-cluster: $(STAMP)
	@command -v java >/dev/null 2>&1 || [ -n "$$JAVA_HOME" ] || { echo "make run-cluster: Spark needs Java 17 (see make run)" >&2; exit 1; }
	$(PY) -m homing.pipeline.cluster --workers 2 --cores 1 -- $(PY) -m homing --db $${HOMING_DB:-postgresql://postgres@127.0.0.1:5432/postgres} pipeline run --master '{master}' --kill-executor $(RUN_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

test: lint
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

bench: $(STAMP)
	@test -f /usr/share/java/postgresql.jar || { command -v apt-get >/dev/null && apt-get install -y -q libpostgresql-jdbc-java >/dev/null 2>&1; } || echo "bench: no PostgreSQL JDBC jar (apt-get install libpostgresql-jdbc-java); bench/spark.py skips the JDBC comparison"
	$(PY) -m bench
	$(PY) bench/grab_cost.py
	$(PY) bench/wal_records.py --out bench/results/wal_records.json
	$(PY) bench/spark.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
