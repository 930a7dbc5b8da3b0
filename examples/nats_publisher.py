#!/usr/bin/env python3
"""Submit a Box draft and list pending drafts over NATS, with atasira's protobuf contract.

A client that is not atasira: it compiles proto/ with grpcio-tools at start, connects to NATS
with its personal access token as the NATS token (atasira's auth callout checks it), and
sends each request to the drafts service as an Envelope on the subjects NATS lets it use:
atasira.box.client.<sha256 of the token>.drafts, with replies on its own inbox
_INBOX.client.<sha256 of the token>. A refusal prints its error code and message on stderr
and exits 1.

    pip install nats-py grpcio-tools
    python examples/nats_publisher.py --help
"""

import argparse
import asyncio
import hashlib
import importlib
import json
import os
import ssl
import sys
import tempfile
import uuid
from pathlib import Path

import nats
from grpc_tools import protoc
from google.protobuf import json_format

PROTO_DIR = Path(__file__).resolve().parent.parent / "proto"


class Refused(Exception):
    """atasira said no: an error code (as the REST API names it) and a message."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code


def load_contract(proto_dir):
    """Compiles proto_dir's .proto files into a temp dir and imports them; returns atasira.v1 modules."""
    files = sorted(str(p.relative_to(proto_dir)) for p in proto_dir.glob("atasira/v1/*.proto"))
    if not files:
        raise SystemExit(f"no atasira/v1/*.proto under {proto_dir} (see --proto-dir)")
    well_known = Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto
    with tempfile.TemporaryDirectory() as out:
        args = ["protoc", f"-I{proto_dir}", f"-I{well_known}", f"--python_out={out}", *files]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc could not compile {proto_dir}")
        sys.path.insert(0, out)
        try:
            modules = {name: importlib.import_module(f"atasira.v1.{name}_pb2") for name in ("envelope", "drafts")}
        finally:
            sys.path.remove(out)
    return argparse.Namespace(**modules)


def to_dict(message):
    """A message in protobuf's JSON mapping, with every field (also those left at their default)."""
    try:
        return json_format.MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    except TypeError:  # protobuf before 5.26 names the option differently
        return json_format.MessageToDict(message, preserving_proto_field_name=True, including_default_value_fields=True)


def identity(token):
    """The subject token NATS grants a token's holder: the SHA-256 of the token, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


class DraftsClient:
    def __init__(self, args, pb):
        self.args, self.pb = args, pb
        self.subject = f"atasira.box.client.{identity(args.token)}.drafts"

    async def call(self, nc, request, reply_type):
        """Sends one request in an Envelope and returns the decoded reply, or raises Refused."""
        correlation_id = str(uuid.uuid4())
        envelope = self.pb.envelope.Envelope(
            message_type=request.DESCRIPTOR.full_name,  # e.g. "atasira.v1.SubmitDraft"
            correlation_id=correlation_id,
            payload=request.SerializeToString(),
        )
        try:
            msg = await nc.request(self.subject, envelope.SerializeToString(), timeout=self.args.timeout)
        except nats.errors.NoRespondersError:
            raise SystemExit(f"no drafts service listens on {self.subject} (is the cluster running?)")
        except nats.errors.TimeoutError:
            raise SystemExit(f"no answer on {self.subject} within {self.args.timeout} s")
        reply = self.pb.envelope.Reply()
        reply.ParseFromString(msg.data)
        if reply.WhichOneof("result") == "error":
            error = reply.error
            code = self.pb.envelope.ErrorCode.Name(error.code).removeprefix("ERROR_CODE_").lower()
            details = "".join(f"\n  {f.key}: {f.message}" for f in error.field_errors)
            raise Refused(code, error.message + details)
        answer = reply_type()
        answer.ParseFromString(reply.ok)
        return answer


async def submit(client, nc, args):
    drafts = client.pb.drafts
    request = drafts.SubmitDraft()
    r = request.request
    r.box_type, r.purpose, r.name, r.allow_network = args.box_type, args.purpose, args.name, args.allow_network
    for field in ("success_criteria", "tools", "os_operations", "url_allowlist", "file_access", "allowed_apps", "prohibited_actions"):
        getattr(r, field).extend(getattr(args, field))
    reply = await client.call(nc, request, drafts.SubmitDraftReply)
    print(json.dumps(to_dict(reply), ensure_ascii=False))


async def pending(client, nc, args):
    drafts, after = client.pb.drafts, 0
    while True:
        page = await client.call(nc, drafts.ListPendingDrafts(limit=args.limit, after=after), drafts.DraftPage)
        for draft in page.drafts:
            print(json.dumps(to_dict(draft), ensure_ascii=False))
        if page.next_cursor == 0:
            return
        after = page.next_cursor


def parse_args(argv):
    env = os.environ.get
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="A refusal prints 'refused: <code>: <message>' on stderr and exits 1."
    )
    parser.add_argument("--nats-url", default=env("ATASIRA_NATS_URL", "tls://127.0.0.1:4222"), help="the cluster's NATS server (env ATASIRA_NATS_URL; now %(default)s)")
    parser.add_argument(
        "--nats-ca",
        type=Path,
        default=env("ATASIRA_NATS_CA"),
        help="the CA certificate NATS's TLS certificate is checked against: ca.pem, as `atasira nats-config` wrote it (env ATASIRA_NATS_CA; default: the system's CAs)",
    )
    parser.add_argument("--token", default=env("ATASIRA_TOKEN"), help="your personal access token, atasira_pat_... (env ATASIRA_TOKEN)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for each answer (default: %(default)s)")
    parser.add_argument("--proto-dir", type=Path, default=PROTO_DIR, help="the directory holding atasira/v1/*.proto (default: the repository's proto/)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = commands.add_parser("submit", help="draft a Box; prints the reply (draft_id, status, over_limit) as one JSON line")
    s.add_argument("--box-type", required=True, help="the Box type to create, e.g. sales-report")
    s.add_argument("--purpose", required=True, help="what the Box is for")
    s.add_argument("--name", default="", help="display name (default: the box type)")
    many = {"action": "append", "default": []}
    s.add_argument("--success-criterion", dest="success_criteria", **many, help="appended to the purpose under 'Success criteria' (repeatable)")
    s.add_argument("--tool", dest="tools", **many, help="a tool the Box may use, e.g. Read (repeatable)")
    s.add_argument("--os-operation", dest="os_operations", **many, help="an OS operation, e.g. file:read (repeatable)")
    s.add_argument("--url", dest="url_allowlist", **many, help="a URL the Box may reach (repeatable)")
    s.add_argument("--file-access", dest="file_access", **many, help="a path the Box may access (repeatable)")
    s.add_argument("--allowed-app", dest="allowed_apps", **many, help="an application the Box may drive (repeatable)")
    s.add_argument("--prohibited-action", dest="prohibited_actions", **many, help="something the Box must never do (repeatable)")
    s.add_argument("--allow-network", action="store_true", help="filtered network access (default: none)")

    p = commands.add_parser("pending", help="list the drafts awaiting approval (admins), one JSON line each")
    p.add_argument("--limit", type=int, default=0, help="page size (0: the service's default); every page is printed")

    args = parser.parse_args(argv)
    if not args.token:
        parser.error("give your token with --token or ATASIRA_TOKEN")
    return args


async def run(args):
    client = DraftsClient(args, load_contract(args.proto_dir))

    async def quiet(error):  # nats-py logs each failed attempt; we say what failed once
        pass

    tls = ssl.create_default_context(cafile=str(args.nats_ca) if args.nats_ca else None)
    try:
        nc = await nats.connect(
            args.nats_url,
            tls=tls,
            token=args.token,
            inbox_prefix=f"_INBOX.client.{identity(args.token)}".encode(),
            connect_timeout=args.timeout,
            allow_reconnect=False,
            max_reconnect_attempts=1,
            error_cb=quiet,
        )
    except Exception as e:  # nats-py raises several kinds here
        why = f"{e} {e.__cause__ or ''} {e.__context__ or ''}".lower()
        if "authorization" in why:
            raise SystemExit(f"NATS refused the token at {args.nats_url}: is it unknown, expired or revoked?")
        if "certificate" in why:
            raise SystemExit(f"NATS at {args.nats_url} has a certificate this client does not trust: pass --nats-ca ca.pem ({e})")
        raise SystemExit(f"cannot connect to NATS at {args.nats_url}: {e or type(e).__name__}")
    try:
        await {"submit": submit, "pending": pending}[args.command](client, nc, args)
    finally:
        await nc.close()


def main(argv=None):
    args = parse_args(argv)
    try:
        asyncio.run(run(args))
    except Refused as e:
        print(f"refused: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
