"""Reasons NeMo Gym's token-capture ledger gives for a call it could not keep (its values)."""

# A call admitted for capture finished without the coordinates of its staged tokens.
UNCOMMITTED_CALL_REASON = "request_finished_without_staged_coordinates"
