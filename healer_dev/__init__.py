"""Development tooling for healer: real programs that stand in for a GPU fleet and its surroundings.

Nothing in ``healer`` or ``api`` imports this package (an import-linter contract checks it); the
``healer demo``, ``healer simulate`` and ``healer provider-receiver`` commands load it lazily.

Modules::

    simulator/     the fleet simulator: dcgm-exporter and node_exporter scrapes with scripted faults
    k8s_emulator   an emulated Kubernetes API server (nodes, pods, eviction, events, leases)
    prometheus     a real Prometheus process for tests, benchmarks and the demo
    victoria_metrics  a real VictoriaMetrics process scraping like Prometheus (tests, benchmarks)
    provider       a stand-in ticket provider (signed webhooks in, signed status callbacks out)
    demo           ``healer demo``: everything above plus ``healer run`` on this machine
"""
