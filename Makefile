# make demo                                   the demo on a fresh machine (Ctrl-C stops it)
# make demo ARGS="--duration 600 --headless"   unattended
# make test                                   the tests in .venv with the dev extras
#                                             (bash .ci/run also installs the services they need)
# make lint                                   ruff, the import-linter layer contracts, mypy --strict
# make image IMAGE=registry.example.com/healer the container image, tagged IMAGE:VERSION (then docker push it)
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= healer
.PHONY: demo test lint image

demo:
	scripts/demo.sh $(ARGS)

.venv/bin/python:
	python3 -m venv .venv

test: .venv/bin/python
	.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	. .venv/bin/activate && python3 -m pytest

lint: .venv/bin/python
	.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	. .venv/bin/activate && ruff check healer healer_dev api tests migrations bench && lint-imports && mypy

image:
	docker build -t $(IMAGE):$(VERSION) .
