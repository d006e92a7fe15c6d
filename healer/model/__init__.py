"""healer's shared vocabulary: plain, frozen data the engine, the adapters and the store all speak.

Stdlib only (no pydantic, SQLAlchemy or kubernetes), so the pure engine may import it:

* :mod:`~healer.model.states`   node lifecycle states and the statuses healer records;
* :mod:`~healer.model.findings` what evaluation hands to the lifecycle;
* :mod:`~healer.model.node`     a node as healer reads it, the taint effect, ownership annotations;
* :mod:`~healer.model.drain`    one set of drain options end to end, and a drain step's report;
* :mod:`~healer.model.limits`   the safety limits the engine judges against.
"""
