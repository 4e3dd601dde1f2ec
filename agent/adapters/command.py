"""The command adapter: run an executable per operation, for brokers managed by scripts.

Invocation: ``<command...> <operation>`` with a JSON request on stdin (the same bodies as the webhook
contract, leases included). Exit status 0 is success; for ``sample`` stdout must be a BrokerSample JSON
document, for ``renew`` a ``{"not_serving": [...]}`` object. stderr is logged on failure. The process is
killed if the call times out. A broker managed by scripts must still end a bundle's service at its lease's
end on its own (docs/broker-adapter.md, "Leases").

Signed calls: running a local executable needs no signature (whoever can run it as the agent's user can
read the key), but a script often just forwards the call to a broker over HTTP. With
``broker.adapter.hmac_key`` each run therefore gets the signature of the equivalent webhook call -- the
operation's method and path, the stdin bytes as the body (an empty body for ``sample``, a ``GET``) -- in
``TRIMTAB_CALL_*`` variables (:data:`ENV`), so the script passes them on as the ``X-Trimtab-*`` headers
without ever holding the key, and the broker verifies them as it verifies the webhook adapter's calls. The
key itself is kept out of the child's environment even when the agent got it from one.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import orjson

from trimtab.agent.adapters.base import BrokerSample, OperationAdapter, decode_sample
from trimtab.agent.adapters.signing import BROKER, NONCE, SIGNATURE, TIMESTAMP, Signer
from trimtab.errors import AdapterError, ConfigError

#: Signed-call header -> the environment variable that carries it to the script. ``TRIMTAB_CALL_METHOD``
#: and ``TRIMTAB_CALL_TARGET`` say which webhook call was signed (the script must send exactly that).
ENV = {
    BROKER: "TRIMTAB_CALL_BROKER",
    TIMESTAMP: "TRIMTAB_CALL_TIMESTAMP",
    NONCE: "TRIMTAB_CALL_NONCE",
    SIGNATURE: "TRIMTAB_CALL_SIGNATURE",
}
ENV_METHOD = "TRIMTAB_CALL_METHOD"
ENV_TARGET = "TRIMTAB_CALL_TARGET"
#: Never handed to a child: the settings variable that may hold the key itself.
_KEY_VARIABLE = "TRIMTAB_BROKER__ADAPTER__HMAC_KEY"


class CommandAdapter(OperationAdapter):
    kind = "command"

    def __init__(
        self, command: list[str], *, hmac_key: bytes | None = None, broker_id: str | None = None
    ) -> None:
        if not command:
            raise ConfigError("the command adapter needs a command (broker.adapter.command)")
        if hmac_key is not None and not broker_id:
            raise ConfigError("a signing command adapter needs the broker id the calls are meant for")
        self.command = list(command)
        self._signer = Signer(hmac_key, broker_id) if hmac_key is not None and broker_id else None

    def _env(self, op: str, body: bytes) -> dict[str, str] | None:
        """The child's environment: the agent's, without the key, plus the signature of the webhook call
        this run stands for (None -- inherit unchanged -- when calls are not signed)."""
        if self._signer is None:
            return None
        env = {k: v for k, v in os.environ.items() if k.upper() != _KEY_VARIABLE}
        method, target = (
            ("GET", "/trimtab/v1/load") if op == "sample" else ("POST", f"/trimtab/v1/bundles/{op}")
        )
        signed = self._signer.headers(method, target, b"" if op == "sample" else body)
        env.update({ENV[h]: v for h, v in signed.items()})
        env[ENV_METHOD] = method
        env[ENV_TARGET] = target
        return env

    async def _op(self, op: str, body: dict[str, Any]) -> Any:
        out = await self._run(op, body)
        if op != "renew":
            return None
        try:
            return orjson.loads(out)
        except orjson.JSONDecodeError as e:
            raise AdapterError(f"renew: output is not a JSON object: {e}") from e

    async def _run(self, op: str, body: dict[str, Any]) -> bytes:
        raw = orjson.dumps(body)
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command,
                op,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env(op, raw),
            )
        except OSError as e:
            raise AdapterError(f"{op}: cannot run {self.command[0]}: {e}") from e
        try:
            out, err = await proc.communicate(raw)
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
