# make demo                                   the demo on a fresh machine (Ctrl-C stops it)
# make demo ARGS="--duration 420 --headless"   unattended
# make test                                   the tests (bash .ci/run also installs what they need)
.PHONY: demo test
demo:
	scripts/demo.sh $(ARGS)
test:
	python3 -m pytest
