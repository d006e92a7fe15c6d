"""``healer run`` against an emulated Kubernetes API, for docker-compose.yml only.

Compose has no Kubernetes, and ``healer run`` needs an API server (node actions, the leader Lease).
This starts healer's Kubernetes API emulator (``healer_dev.k8s_emulator``, the one the demo and
the tests use) inside the healer container, on loopback, holding the same GPU nodes the fleet
simulator serves metrics for (with realistic pods and a PodDisruptionBudget), writes a kubeconfig
for it, and runs ``healer run`` in this process. Nothing here can reach a real cluster.

Usage (docker-compose.yml): ``python /compose/healer_with_emulated_cluster.py --nodes 64 [-- ARGS]``;
ARGS go to ``healer run``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import yaml

from healer.cli import app
from healer_dev.k8s_emulator import KubernetesEmulator, gpu_fleet, namespace


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64, help="GPU nodes (match `healer simulate`).")
    parser.add_argument("run_args", nargs="*", help="Extra arguments for `healer run`.")
    args = parser.parse_args(argv)

    lease_namespace = os.environ.get("HEALER_KUBERNETES__NAMESPACE", "healer-system")
    emulator = KubernetesEmulator(auto_reschedule=True).start()
    emulator.load([namespace(lease_namespace), *gpu_fleet(args.nodes)])
    kubeconfig = Path(tempfile.mkdtemp(prefix="healer-")) / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulated", "cluster": {"server": emulator.host}}],
                "users": [{"name": "emulated", "user": {}}],
                "contexts": [{"name": "emulated", "context": {"cluster": "emulated", "user": "emulated"}}],
                "current-context": "emulated",
            }
        ),
        encoding="utf-8",
    )
    os.environ["HEALER_KUBERNETES__KUBECONFIG"] = str(kubeconfig)
    print(f"emulated Kubernetes API with {args.nodes} GPU nodes at {emulator.host}", flush=True)
    try:
        app(["run", *args.run_args], prog_name="healer")
    finally:
        emulator.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
