"""A PD decode server running PARSE takes requests only from prefill servers running PARSE with
the same draft.

What it changes: AROUND `sglang.srt.disaggregation.decode.DecodePreallocQueue._ensure_prefill_info`
(a decode server, each time requests wait for their prefill server's parallel info). Once SGLang's
own handshake has that info (`/route` on the prefill's bootstrap server), the prefill server's
`/server_info` is read once, from the HTTP port it registered with its bootstrap server
(`prefill_http_port`), and its "parse" state's `draft` compared with this server's
(`draft_identity`). A prefill server that does not run PARSE, or runs it with another draft, is
refused: its requests end with an error naming both drafts, and the decode server goes on
serving the others.

Why: the prompt's draft KV comes from the prefill server (SGLang transfers its primary draft KV
pool beside the target's, and PARSE's draft pool is that pool). A prefill server without PARSE
sends none, and SGLang then moves the target's layers alone without a word
(disaggregation/common/conn.py: "Decode has draft model KV while Prefill is deployed without
speculative decoding"); one with another draft sends another model's KV. Either way every round
drafts from a wrong prompt KV: lossless output at a lower acceptance, and with the judge on,
other output.
"""

from __future__ import annotations

import hashlib
import json
import logging

import requests
from sglang.srt.plugins.hook_registry import HookType

from parse_sglang.scheduler_patches import register_hooks_once

logger = logging.getLogger(__name__)

TARGET = "sglang.srt.disaggregation.decode.DecodePreallocQueue._ensure_prefill_info"
HOOKED_SIGNATURES = {
    TARGET: "(self, addr_to_reqs: 'Dict[str, List[DecodeRequest]]') "
    "-> 'Tuple[Dict[str, List[DecodeRequest]], List[DecodeRequest]]'"
}
PEER_TIMEOUT_S = 10.0  # the prefill server answers /server_info between its batches

_verdicts: dict[str, str | None] = {}  # per prefill bootstrap address: None (same draft) or the refusal


def draft_identity(draft_runner) -> dict:
    """What must match on both sides of a PD pair: the draft's architecture, its config's hash
    (without its path) and the layout of its KV pool."""
    config = draft_runner.model_config.hf_config.to_dict()
    config.pop("_name_or_path", None)
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]
    pool = draft_runner.token_to_kv_pool
    return {
        "architectures": config.get("architectures"),
        "config_sha256": digest,
        "kv_layers": pool.layer_num,
        "kv_dtype": str(pool.dtype),
    }


def refusal(url: str, info: dict, own: dict) -> str | None:
    """Why the prefill server at `url` (its `/server_info`: `info`) cannot feed a PARSE decode
    server whose draft is `own`, or None."""
    states = info.get("internal_states") or [{}]
    theirs = (states[0].get("parse") or {}).get("draft")
    if theirs == own:
        return None
    return (
        "PARSE on a PD decode server needs its prefill server to run PARSE with the same draft "
        f"(the prompt's draft KV comes from there): the prefill server {url} runs "
        f"--speculative-algorithm {info.get('speculative_algorithm')} with draft {theirs}, "
        f"this decode server PARSE with draft {own}"
    )


def verdict(addr: str, url: str, own: dict) -> str | None:
    """`refusal` for the prefill server at bootstrap address `addr` (HTTP `url`), kept for the
    process; a /server_info that cannot be read refuses this time only."""
    if addr not in _verdicts:
        try:
            info = requests.get(url + "/server_info", timeout=PEER_TIMEOUT_S).json()
        except (requests.RequestException, ValueError) as err:
            return f"PARSE could not read the prefill server's {url}/server_info to compare drafts: {err}"
        _verdicts[addr] = refusal(url, info, own)
        if _verdicts[addr]:
            logger.error(_verdicts[addr])
    return _verdicts[addr]


def refuse_other_drafts(original, queue, addr_to_reqs):
    """AROUND _ensure_prefill_info: the requests of a refused prefill server leave the ready set
    failed, with the reason as their error (SGLang's own path for a prefill server it cannot
    reach). Not checked: a decode server without PARSE, and a prefill server with no HTTP port
    of its own (SGLang's Rust server)."""
    ready, remaining = original(queue, addr_to_reqs)
    worker = queue.scheduler.draft_worker
    if not hasattr(worker, "draft_identity"):
        return ready, remaining
    table = getattr(queue.kv_manager, "prefill_info_table", {})
    for addr in list(ready):
        port = getattr(table.get(addr), "prefill_http_port", None)
        if port is None:
            continue
        reason = verdict(addr, f"http://{addr.rsplit(':', 1)[0]}:{port}", worker.draft_identity())
        if reason:
            for decode_req in ready.pop(addr):
                if decode_req.kv_receiver is not None:
                    decode_req.kv_receiver.abort()
                    queue.kv_manager.record_failure(decode_req.req.bootstrap_room, reason)
    return ready, remaining


def install() -> str:
    register_hooks_once(__name__, (TARGET, refuse_other_drafts, HookType.AROUND))
    return f"{TARGET}: AROUND hook refusing prefill servers that do not run PARSE with this server's draft"
