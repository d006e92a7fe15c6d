"""Provider tickets: a durable outbox, templated and signed webhooks, inbound status callbacks.

Modules (each one concept)::

    outbox      request_ticket(): ticket + outbox rows in the caller's transaction (idempotent)
    payloads    the render context; repeat-offender (escalation) decision
    templates   sandboxed Jinja2 rendering of JSON payloads (generic, slack, jira built in)
    signing     HMAC-SHA256 headers (webhooks; callbacks over method, path, body), nonces, secrets
    delivery    deliver_due(): the delivery job (claim, send, record; backoff, Retry-After)
    service     provider status callbacks, manual close/retry, listing, provider_stats()

A provider in the settings (``tickets.providers``)::

    - name: acme
      url: https://support.acme.example/api/v1/tickets     # redacted everywhere (healer.redaction)
      template: generic.json.j2                            # or slack.json.j2, jira.json.j2, a path
      secret_env: ACME_WEBHOOK_SECRET                      # or secret_file: /var/run/secrets/acme
      callback_secret_env: ACME_CALLBACK_SECRET            # its status callbacks (else the shared one)
      timeout_seconds: 10
      headers: {Authorization: "${env:ACME_TOKEN}"}        # ${env:NAME} / ${file:/path} read at send
      escalation_template: generic.json.j2                 # for repeat offenders
      escalation_provider: acme-urgent                     # another configured provider

Errors: :class:`~healer.errors.TicketError` (render or delivery configuration),
:class:`~healer.errors.SignatureError` (an inbound callback refused), and
:class:`~healer.operations.OperationError` (``service.TicketNotFound``, a close that does not apply).
"""
