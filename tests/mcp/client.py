"""An MCP client no one here wrote (the official Python SDK, PyPI `mcp`) driving atasira's
MCP server: over stdio (it starts `atasira mcp`) or over streamable HTTP (the gateway's
/mcp with a bearer token). It makes the calls it is given in one session and prints what
it saw as one JSON object on stdout; tests/mcp.rs judges it.

    client.py stdio --bin ATASIRA --url BFF_URL --token PAT --calls JSON
    client.py http --url http://HOST:PORT/mcp --token PAT --calls JSON

--calls is a JSON list of [tool_name, arguments]. The report:
    {"server": {"name", "version"}, "protocol_version", "instructions",
     "tools": [{"name", "description", "input_schema"}],
     "calls": [{"tool", "is_error", "text", "structured"}]}
or {"error": "..."} when no session could be made (a refused token).
"""

import argparse
import asyncio
import json
import os
import sys
from contextlib import asynccontextmanager

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

# A session that makes no progress in this long has failed.
TIMEOUT_S = 60


@asynccontextmanager
async def http_transport(url, token):
    """The SDK's streamable HTTP transport with the token as bearer (old and new SDKs)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        import httpx
        from mcp.client.streamable_http import streamable_http_client
    except ImportError:
        streamable_http_client = None
    if streamable_http_client is not None:
        async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=300)) as client:
            async with streamable_http_client(url, http_client=client) as (read, write, _):
                yield read, write
    else:
        from mcp.client.streamable_http import streamablehttp_client

        async with streamablehttp_client(url, headers=headers) as (read, write, _):
            yield read, write


@asynccontextmanager
async def stdio_transport(binary, url, token):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATASIRA_")}
    env.update({"ATASIRA_BFF_URL": url, "ATASIRA_PAT": token, "RUST_LOG": "warn"})
    params = StdioServerParameters(command=binary, args=["mcp"], env=env)
    async with stdio_client(params) as (read, write):
        yield read, write


def describe(e):
    """An exception in words; the leaves of an exception group (anyio's task groups)."""
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(describe(x) for x in e.exceptions)
    return f"{type(e).__name__}: {e}"


def text_of(result):
    return "\n".join(block.text for block in result.content if getattr(block, "type", None) == "text")


async def session(transport, calls):
    async with transport as (read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            listed = await s.list_tools()
            report = {
                "server": {"name": init.serverInfo.name, "version": init.serverInfo.version},
                "protocol_version": str(init.protocolVersion),
                "instructions": init.instructions,
                "tools": [{"name": t.name, "description": t.description, "input_schema": t.inputSchema} for t in listed.tools],
                "calls": [],
            }
            for name, arguments in calls:
                result = await s.call_tool(name, arguments)
                report["calls"].append(
                    {"tool": name, "is_error": bool(result.isError), "text": text_of(result), "structured": result.structuredContent}
                )
            return report


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--bin")
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", default="")
    parser.add_argument("--calls", default="[]")
    args = parser.parse_args()
    calls = json.loads(args.calls)
    if args.transport == "stdio":
        transport = stdio_transport(args.bin, args.url, args.token)
    else:
        transport = http_transport(args.url, args.token)
    try:
        report = await asyncio.wait_for(session(transport, calls), TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - the report says what went wrong
        report = {"error": describe(e)}
    json.dump(report, sys.stdout)
    print()


if __name__ == "__main__":
    asyncio.run(main())
