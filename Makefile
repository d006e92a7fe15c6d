# make demo                                   the demo on a fresh machine (Ctrl-C stops it)
# make demo ARGS="--duration 420 --headless"   unattended
# make test                                   the tests (bash .ci/run also installs what they need)
# make image IMAGE=registry.example.com/healer the container image, tagged IMAGE:VERSION (then docker push it)
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= healer
.PHONY: demo test image
demo:
	scripts/demo.sh $(ARGS)
test:
	python3 -m pytest
image:
	docker build -t $(IMAGE):$(VERSION) .
