"""Dry-run validation Jobs: the Job healer would create, recorded; nothing created in the cluster.

With ``validation.enabled`` and ``safety.dry_run``, every return to service still goes through the
validation step, so the record shows it: ``start`` writes a ``dry_run`` action ``validation-job``
whose detail is the Job's name, namespace and full manifest (as :meth:`ValidationJobs.body` builds
it for the node as read), and ``delete`` a ``dry_run`` ``validation-cleanup``. No Job runs, so
``result`` answers as if it had passed, marked ``{"dry_run": true}`` in the result (the
transition's evidence): the dry-run then goes on the way an acting healer whose Job passed would.
"""

from __future__ import annotations

import logging

from healer.actions.dryrun import RecordingNodeActions
from healer.actions.validation import ValidationJobs
from healer.model.node import NodeView
from healer.model.validation import ValidationResult

log = logging.getLogger(__name__)

#: The result a dry-run Job "returns" (it never ran).
DRY_RUN_RESULT = ValidationResult(
    "succeeded",
    exit_code=0,
    result={"dry_run": True, "passed": True},
    message="dry-run: the validation Job was recorded, not created; taken as passed",
)


class RecordedValidationJobs:
    """:class:`~healer.actions.validation.Validator` for dry-run (see the module docstring).

    Args:
        jobs: builds the manifests (its cluster clients are never called).
        recorder: the dry-run node recorder, which writes the rows.
    """

    def __init__(self, jobs: ValidationJobs, recorder: RecordingNodeActions) -> None:
        self.jobs = jobs
        self.recorder = recorder
        self._nodes: dict[str, str] = {}  # job -> node, for the clean-up's row

    def start(self, view: NodeView, job: str, incident: int) -> None:
        """Record the Job it would create on ``view`` for ``incident``."""
        detail = {
            "job": job,
            "namespace": self.jobs.settings.namespace,
            "manifest": self.jobs.body(view, job, incident),
        }
        self._nodes[job] = view.name
        self.recorder.record(
            "validation-job",
            view.name,
            now=self.recorder.clock(),
            detail=detail,
            incident_id=incident or None,
        )

    def result(self, job: str) -> ValidationResult:
        """Passed (no Job ran; marked ``dry_run`` in the result)."""
        return DRY_RUN_RESULT

    def delete(self, job: str) -> None:
        """Record the deletion it would make (of a Job this process recorded; a Job recorded
        before a restart is only logged)."""
        node = self._nodes.pop(job, None)
        if node is None:
            log.info("dry-run: would delete validation job %s", job)
            return
        self.recorder.record("validation-cleanup", node, now=self.recorder.clock(), detail={"job": job})
