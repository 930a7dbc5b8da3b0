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

A Worker's id follows from its launch_id alone, so a launch_id the admin's run used is a
`launch_id_conflict` in the agent's: the launch_id of every valid launch gets the run's
name (`ATASIRA_FUZZ_RUN`) as a suffix. Within a run, a repeated launch_id still meets the
launch it names (the same Worker, or the conflict).
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
    run = os.environ.get("ATASIRA_FUZZ_RUN")
    launch_id = case.body.get("launch_id") if isinstance(case.body, dict) else None
    if run and case.path == "/api/v1/boxes/{box_id}/workers" and isinstance(launch_id, str):
        case.body["launch_id"] = f"{launch_id[:100]}-{run}"
    box_type = os.environ.get("ATASIRA_FUZZ_BOX_TYPE")
    if box_type and case.path == "/api/v1/boxes/feasibility" and isinstance(case.body, dict) and "box_type" in case.body:
        case.body["box_type"] = box_type
