"""Which of NeMo Gym's capture switches a run config turns on that nemo_gym does not serve.

NeMo Gym's training-token capture ledger (``token_id_capture.enabled``, ``external_staging``) is
not implemented here: token IDs travel on the response items instead (docs/TOKEN_IDS.md). A run
that asks for it is refused where its config is loaded, so no process starts and no trainer waits
for tokens that will never be captured.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TOKEN_CAPTURE_UNAVAILABLE = (
    "{what}: NeMo Gym's training-token capture ledger is not implemented in nemo_gym; set "
    "return_token_id_information: true on the model server instead (each response's last output "
    "item then carries prompt_token_ids, generation_token_ids and generation_log_probs; see "
    "docs/TOKEN_IDS.md)"
)


def unserved_token_capture_switches(config: Mapping[str, Any]) -> list[str]:
    """``token_id_capture.enabled`` / ``token_id_capture.external_staging`` when ``config`` sets them."""
    block = config.get("token_id_capture")
    if not isinstance(block, Mapping):
        return []
    return [f"token_id_capture.{key}" for key in ("enabled", "external_staging") if block.get(key) is True]
