"""The ``healer`` command line: one module per command group.

Modules::

    root               the ``healer`` app: --config, --version, and the registration of everything below
    context            settings for an invocation, the operator's name, loading dev tooling
    tables             plain-text tables
    run                healer run: the controller with its dashboard
    serve              healer serve: the dashboard alone
    rules              healer rules validate|show|test|export
    evaluate           healer evaluate --once: one detection tick, printed
    db                 healer db upgrade
    node               healer node list|show|release
    incident           healer incident list|show
    breaker            healer breaker status|reset
    pause              healer pause, healer resume
    ticket             healer ticket list|close|retry|deliver|stats
    demo               healer demo            (healer_dev, loaded when run)
    simulate           healer simulate        (healer_dev, loaded when run)
    provider_receiver  healer provider-receiver (healer_dev, loaded when run)

Command modules import only typer and the standard library at module level; each command imports
the features it uses when it runs, and builds them through the composition root
(:mod:`healer.wiring`). No feature package imports this one.
"""

from healer.cli.root import app, main

__all__ = ["app", "main"]
