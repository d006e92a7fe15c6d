"""InfiniBand ``hw_counters`` from sysfs, which node_exporter 1.5 does not export.

Layout (Linux ``drivers/infiniband/core/sysfs.c``, ``hw_stats`` groups)::

    <sysfs>/class/infiniband/<device>/ports/<port>/hw_counters/<name>    one decimal number
    <sysfs>/class/infiniband/<device>/hw_counters/<name>                 device-wide (not read)

Which names exist is the driver's: mlx5 (``drivers/infiniband/hw/mlx5/counters.c``) lists
``out_of_sequence``, ``local_ack_timeout_err``, ``rnr_nak_retry_err``, ``packet_seq_err``,
``duplicate_request``, ``implied_nak_seq_err``, ``req_cqe_error``, ``roce_adp_retrans`` and more.
NVIDIA's mlx5 counter documentation ("Understanding mlx5 Linux counters"): ``local_ack_timeout_err``
is "the number of times the QP's ack timer expired for RC, XRC, DCT QPs at the sender side"
(each one a retransmission), ``out_of_sequence`` "the number of out of sequence packets received",
``rnr_nak_retry_err`` "the number of received RNR NAK packets". Every file found is read; none is
assumed. ``lifespan`` is a setting of the directory (milliseconds the driver caches the values),
not a counter, and is skipped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: Files of ``hw_counters/`` that are settings, not counters.
NOT_COUNTERS = frozenset({"lifespan"})


@dataclass(frozen=True)
class HwCounter:
    """One ``hw_counters`` file: its HCA ``device`` (``mlx5_0``), ``port`` (``1``), ``counter`` (the
    file name) and value (a count since the driver loaded)."""

    device: str
    port: str
    counter: str
    value: int


@dataclass(frozen=True)
class ReadProblem:
    """A fact that could not be read: ``source`` (a path or ``nvml``), what went wrong."""

    source: str
    message: str


def read_hw_counters(sysfs: Path) -> tuple[list[HwCounter], list[ReadProblem]]:
    """Every port's ``hw_counters`` under ``<sysfs>/class/infiniband``, sorted by device, port and
    name, and the files that could not be read or parsed (each named, the rest still read).

    No ``class/infiniband`` directory is no HCA (an empty list, no problem): a node without
    InfiniBand. An HCA or port without ``hw_counters`` (a driver that has none) adds nothing.
    """
    base = sysfs / "class" / "infiniband"
    counters: list[HwCounter] = []
    problems: list[ReadProblem] = []
    try:
        devices = sorted(os.listdir(base))
    except FileNotFoundError:
        return counters, problems
    except OSError as exc:
        return counters, [ReadProblem(str(base), exc.strerror or str(exc))]
    for device in devices:
        ports_dir = base / device / "ports"
        try:
            ports = sorted(os.listdir(ports_dir), key=lambda p: (len(p), p))
        except FileNotFoundError:
            continue
        except OSError as exc:
            problems.append(ReadProblem(str(ports_dir), exc.strerror or str(exc)))
            continue
        for port in ports:
            hw = ports_dir / port / "hw_counters"
            try:
                names = sorted(os.listdir(hw))
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:
                problems.append(ReadProblem(str(hw), exc.strerror or str(exc)))
                continue
            for name in names:
                if name in NOT_COUNTERS:
                    continue
                path = hw / name
                try:
                    text = path.read_text().strip()
                except OSError as exc:
                    problems.append(ReadProblem(str(path), exc.strerror or str(exc)))
                    continue
                try:
                    value = int(text)
                except ValueError:
                    problems.append(ReadProblem(str(path), f"not a number: {text[:40]!r}"))
                    continue
                counters.append(HwCounter(device, port, name, value))
    return counters, problems
