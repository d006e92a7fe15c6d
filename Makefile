# make demo                                   the demo on a fresh machine (Ctrl-C stops it)
# make demo ARGS="--duration 420 --headless"   unattended
# make test                                   the tests in .venv with the dev extras
#                                             (bash .ci/run also installs the services they need)
.PHONY: demo test
demo:
	scripts/demo.sh $(ARGS)
.venv/bin/python:
	python3 -m venv .venv
test: .venv/bin/python
	.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	. .venv/bin/activate && python3 -m pytest
