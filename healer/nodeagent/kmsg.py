"""The kernel log as the agent reads it: ``/dev/kmsg`` records and the NVIDIA driver's Xid lines.

Record format (Linux ``Documentation/ABI/testing/dev-kmsg``)::

    <prefix>,<sequence>,<timestamp>,<flags>[,<more fields>];<message>
     KEY=value                         (continuation lines: the record's dictionary)

``prefix`` is ``facility * 8 + level``; ``timestamp`` is microseconds since boot (the kernel's
monotonic clock); ``sequence`` is 64-bit and increases by one per record, so a gap means records
the ring buffer dropped. Each ``read()`` of the device returns exactly one record; ``EAGAIN`` (the
descriptor is non-blocking) means no more for now; ``EPIPE`` means the next record was overwritten
before it was read, and the next ``read()`` continues with the oldest one still held. A descriptor
opened afresh starts at the oldest record the ring buffer holds (the log since boot, as far as the
buffer reaches).

Xid lines, as the NVIDIA driver (``NVRM``) prints them (open-gpu-kernel-modules ``nvRmXid``;
lines published in NVIDIA's Xid documentation and forum threads)::

    NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:18:00): 13, pid=2201, name=python, Graphics SM Warp Exception on ...
    NVRM: Xid (PCI:0000:04:00): 48, An uncorrectable double bit error (DBE) has been detected ...

``PCI:`` gives domain, bus and device (no function): the GPU is function 0 of that device.

Two sources: :class:`DevKmsg` (the device, the real one) and :class:`KmsgFile` (a text file of
records, one a line, that tests and fixtures append to). Both return new :class:`KmsgRecord` on
each :meth:`~KmsgSource.read_new` and never raise for one bad line: it is counted in
``malformed`` and skipped.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

#: The kernel's own limit on one record's text (``CONSOLE_EXT_LOG_MAX`` is 8192 bytes).
RECORD_MAX_BYTES = 8192

_RECORD = re.compile(r"^(?P<prefix>\d+),(?P<seq>\d+),(?P<usec>\d+),(?P<flags>[^,;]*)(?:,[^;]*)?;(?P<msg>.*)$")
_XID = re.compile(
    r"NVRM: Xid \(PCI:(?P<domain>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):(?P<device>[0-9a-fA-F]{2})"
    r"(?:\.[0-9a-fA-F])?\): (?P<xid>\d+),?\s*(?P<detail>.*)$"
)


@dataclass(frozen=True)
class KmsgRecord:
    """One kernel log record: ``level`` 0 (emerg) .. 7 (debug), ``sequence``, ``usec`` since boot."""

    level: int
    facility: int
    sequence: int
    usec: int
    message: str

    def line(self) -> str:
        """The record as ``dmesg`` prints it: ``[   12.345678] message``."""
        return f"[{self.usec // 1_000_000:>5}.{self.usec % 1_000_000:06d}] {self.message}"


@dataclass(frozen=True)
class XidLine:
    """An Xid the driver logged: ``pci_bus_id`` as NVML and dcgm-exporter write it
    (``00000000:3B:00.0``), the Xid code, the rest of the line (``detail``), and its record."""

    pci_bus_id: str
    xid: int
    detail: str
    record: KmsgRecord


def parse_record(text: str) -> KmsgRecord | None:
    """One record's first line (without the newline); None when it is not a record (a continuation
    line, which starts with a space, or anything else)."""
    m = _RECORD.match(text)
    if m is None:
        return None
    prefix = int(m["prefix"])
    return KmsgRecord(
        level=prefix & 7, facility=prefix >> 3, sequence=int(m["seq"]), usec=int(m["usec"]), message=m["msg"]
    )


def pci_bus_id(domain: int, bus: int, device: int, function: int = 0) -> str:
    """NVML's ``busId`` form: 8 hex digits of domain, upper case (``00000000:3B:00.0``)."""
    return f"{domain:08X}:{bus:02X}:{device:02X}.{function:X}"


def parse_xid(record: KmsgRecord) -> XidLine | None:
    """The Xid in ``record``, or None when it is no Xid line."""
    m = _XID.search(record.message)
    if m is None:
        return None
    bus_id = pci_bus_id(int(m["domain"], 16), int(m["bus"], 16), int(m["device"], 16))
    return XidLine(pci_bus_id=bus_id, xid=int(m["xid"]), detail=m["detail"].strip(), record=record)


class KmsgSource(Protocol):
    """Where kernel log records come from."""

    @property
    def name(self) -> str:
        """What the source reads (a path), for messages."""
        ...

    #: Lines that were not records, records lost to the ring buffer (EPIPE or a sequence gap).
    malformed: int
    lost: int

    def read_new(self) -> list[KmsgRecord]:
        """Records not returned before, oldest first. Raises OSError when the source cannot be read."""
        ...

    def read_all(self) -> list[KmsgRecord]:
        """Every record the source holds now (the log since boot, as far as it reaches), without
        changing what :meth:`read_new` returns next."""
        ...


@dataclass
class DevKmsg:
    """``/dev/kmsg`` (or ``path``): one record per ``read()``, non-blocking. Reading it needs
    ``CAP_SYSLOG`` or ``kernel.dmesg_restrict=0`` (the chart's agent runs privileged)."""

    path: str = "/dev/kmsg"
    malformed: int = 0
    lost: int = 0
    _fd: int | None = field(default=None, repr=False)
    _last_seq: int | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.path

    def _drain(self, fd: int) -> list[KmsgRecord]:
        out: list[KmsgRecord] = []
        while True:
            try:
                chunk = os.read(fd, RECORD_MAX_BYTES)
            except BlockingIOError:
                return out
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten before we read it: go on with the oldest
                    self.lost += 1
                    continue
                if exc.errno == errno.EAGAIN:
                    return out
                raise
            if not chunk:
                return out
            record = parse_record(chunk.decode("utf-8", "replace").split("\n", 1)[0])
            if record is None:
                self.malformed += 1
            else:
                out.append(record)

    def read_new(self) -> list[KmsgRecord]:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        records = self._drain(self._fd)
        if records and self._last_seq is not None and records[0].sequence > self._last_seq + 1:
            self.lost += records[0].sequence - self._last_seq - 1
        if records:
            self._last_seq = records[-1].sequence
        return records

    def read_all(self) -> list[KmsgRecord]:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            return self._drain(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass
class KmsgFile:
    """A text file of records, one a line in the device's format (continuation lines, starting
    with a space, are skipped): the fixture the tests append to, or a saved ``/dev/kmsg``."""

    path: Path
    malformed: int = 0
    lost: int = 0
    _offset: int = field(default=0, repr=False)

    @property
    def name(self) -> str:
        return str(self.path)

    def _parse(self, text: str) -> list[KmsgRecord]:
        out: list[KmsgRecord] = []
        for line in text.splitlines():
            if not line or line.startswith(" "):
                continue
            record = parse_record(line)
            if record is None:
                self.malformed += 1
            else:
                out.append(record)
        return out

    def read_new(self) -> list[KmsgRecord]:
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        complete = data.rfind(b"\n") + 1  # a line still being written is read next time
        self._offset += complete
        return self._parse(data[:complete].decode("utf-8", "replace"))

    def read_all(self) -> list[KmsgRecord]:
        malformed = self.malformed
        try:
            return self._parse(self.path.read_text("utf-8", "replace"))
        finally:
            self.malformed = malformed
