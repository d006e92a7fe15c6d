# make demo                                   the demo on a fresh machine (Ctrl-C stops it)
# make demo ARGS="--duration 420 --headless"   unattended
# make test                                   the tests (bash .ci/run also installs what they need)
# make lint                                   ruff, the import-linter layer contracts, mypy --strict
# make image IMAGE=registry.example.com/healer the container image, tagged IMAGE:VERSION (then docker push it)
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= healer
.PHONY: demo test lint image
demo:
	scripts/demo.sh $(ARGS)
test:
	python3 -m pytest
lint:
	ruff check healer healer_dev api tests migrations bench
	lint-imports
	mypy
image:
	docker build -t $(IMAGE):$(VERSION) .
