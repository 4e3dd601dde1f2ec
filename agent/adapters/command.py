"""The command adapter: run an executable per operation, for brokers managed by scripts.

Invocation: ``<command...> <operation>`` with a JSON request on stdin (the same bodies as the webhook
contract, leases included). Exit status 0 is success; for ``sample`` stdout must be a BrokerSample JSON
document, for ``renew`` a ``{"not_serving": [...]}`` object. stderr is logged on failure. The process is
killed if the call times out. A broker managed by scripts must still end a bundle's service at its lease's
end on its own (docs/broker-adapter.md, "Leases").
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from trimtab.agent.adapters.base import BrokerSample, OperationAdapter, decode_sample
from trimtab.errors import AdapterError, ConfigError


class CommandAdapter(OperationAdapter):
    kind = "command"

    def __init__(self, command: list[str]) -> None:
        if not command:
            raise ConfigError("the command adapter needs a command (broker.adapter.command)")
        self.command = list(command)

    async def _op(self, op: str, body: dict[str, Any]) -> Any:
        out = await self._run(op, body)
        if op != "renew":
            return None
        try:
            return orjson.loads(out)
        except orjson.JSONDecodeError as e:
            raise AdapterError(f"renew: output is not a JSON object: {e}") from e

    async def _run(self, op: str, body: dict[str, Any]) -> bytes:
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command,
                op,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as e:
            raise AdapterError(f"{op}: cannot run {self.command[0]}: {e}") from e
        try:
            out, err = await proc.communicate(orjson.dumps(body))
        except asyncio.CancelledError:
            proc.kill()
            await proc.wait()
            raise
        if proc.returncode != 0:
            raise AdapterError(f"{op}: exit status {proc.returncode}: {err.decode(errors='replace')[-300:]}")
        return out

    async def sample(self) -> BrokerSample:
        out = await self._run("sample", {})
        return decode_sample(out, "the output")

    async def aclose(self) -> None:
        return None
