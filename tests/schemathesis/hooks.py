"""Schemathesis hooks for tests/openapi_fuzz.rs.

A well-formed Idempotency-Key that was already used with a different request is refused
with 422 `idempotency_key_reuse`, as documented. Generated keys are short and repeat
("0", "00", ...), so the well-formed key of every valid request gets a unique suffix: each
is then a first request, and the refusal stays where it belongs (its own test in
tests/drafts.rs). Invalid requests are left as generated (editing one would make
schemathesis re-check it as a valid one).

A valid feasibility request names the box_type of a Box the test seeded
(`ATASIRA_FUZZ_BOX_TYPE`), so the check itself runs, not only its 404; the generated
task_description is kept.
"""

import os
import re
import uuid

import schemathesis

WELL_FORMED = re.compile(r"[!-~]{1,255}")


@schemathesis.hook
def before_call(context, case, kwargs):
    if case.meta is not None and case.meta.generation.mode.is_negative:
        return
    headers = case.headers or {}
    for name in list(headers):
        value = headers[name]
        if name.lower() == "idempotency-key" and isinstance(value, str) and WELL_FORMED.fullmatch(value):
            headers[name] = f"{value[:200]}-{uuid.uuid4().hex}"
    box_type = os.environ.get("ATASIRA_FUZZ_BOX_TYPE")
    if box_type and case.path == "/api/v1/boxes/feasibility" and isinstance(case.body, dict) and "box_type" in case.body:
        case.body["box_type"] = box_type
