"""retail_service: a small retail help desk with per-rollout order state and a goal check.

Each rollout gets its own copy of the row's ``orders`` (seeded by ``/seed_session``). The
assistant looks orders up, cancels pending ones, returns delivered ones and changes a pending
order's shipping address; ``verify`` gives 1.0 when every order ends in the state the row's
``goal_orders`` asks for (only the fields it names) and no other order changed. It is the
example environment of ``simulated_user_agent``: the customer (a second model) knows the goal,
the assistant only learns it by talking.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    HTTPError,
    SimpleResourcesServer,
    tool,
)
from nemo_gym.response_items import function_calls

ORDERS_KEY = "orders"

OrderStatus = Literal["pending", "delivered", "cancelled", "returned"]


class Item(BaseModel):
    """One line of an order."""

    model_config = ConfigDict(extra="forbid")

    name: str
    price: float = Field(ge=0)


class Order(BaseModel):
    """An order as the tools show it."""

    model_config = ConfigDict(extra="forbid")

    status: OrderStatus
    items: list[Item] = Field(min_length=1)
    address: str = ""


class RetailSeedSessionRequest(BaseSeedSessionRequest):
    """The row: ``orders`` maps order ids to orders (the customer's account)."""

    orders: dict[str, Order] = Field(min_length=1)


class OrderRequest(BaseModel):
    """Arguments naming one order."""

    model_config = ConfigDict(extra="forbid")

    order_id: str


class CancelOrderRequest(OrderRequest):
    """Arguments of ``cancel_order``."""

    reason: str = ""


class ChangeAddressRequest(OrderRequest):
    """Arguments of ``change_address``."""

    address: str = Field(min_length=1)


class RetailVerifyRequest(BaseVerifyRequest):
    """The row plus response: ``goal_orders`` maps order ids to the fields they must end with."""

    orders: dict[str, Order]
    goal_orders: dict[str, dict[str, Any]]

    @model_validator(mode="after")
    def _goal_names_known_orders(self) -> RetailVerifyRequest:
        unknown = sorted(set(self.goal_orders) - set(self.orders))
        if unknown:
            raise ValueError(f"goal_orders names orders the row does not have: {unknown}")
        return self


class RetailVerifyResponse(RetailVerifyRequest, BaseVerifyResponse):
    """Reward plus what verify found."""

    # The row's other fields stay in the rollout (the base answer, as NeMo Gym's, drops them).
    model_config = ConfigDict(extra="allow")

    session_found: bool
    final_orders: dict[str, Order] | None = None
    mismatches: list[str] = Field(default_factory=list)
    num_tool_calls: int = 0
    num_user_turns: int = 0


class RetailServiceConfig(BaseResourcesServerConfig):
    """No fields of its own (``session_ttl_s`` frees abandoned rollouts)."""


class RetailServiceServer(SimpleResourcesServer):
    """Orders per rollout; tools change them; verify compares them with the row's goal."""

    config: RetailServiceConfig
    plain_bodies = True  # handlers read response/responses_create_params as dicts

    async def seed_session(self, body: RetailSeedSessionRequest) -> BaseSeedSessionResponse:  # type: ignore[override]
        """Open this rollout's copy of the row's orders."""
        self.session[ORDERS_KEY] = {key: order.model_dump() for key, order in body.orders.items()}
        return BaseSeedSessionResponse()

    def _order(self, order_id: str) -> dict[str, Any]:
        state = self.sessions.get(self.session_id or "", create=False)
        if state is None or ORDERS_KEY not in state:
            raise HTTPError(409, "no orders for this rollout: call /seed_session with the row first")
        order = state[ORDERS_KEY].get(order_id)
        if order is None:
            known = ", ".join(sorted(state[ORDERS_KEY]))
            raise HTTPError(422, f"order_id {order_id!r} not found; this customer's orders: {known}")
        return order

    @tool
    async def get_order(self, body: OrderRequest) -> Order:
        """Look up an order: its status, items and shipping address."""
        return Order(**self._order(body.order_id))

    @tool
    async def cancel_order(self, body: CancelOrderRequest) -> Order:
        """Cancel a pending order (a delivered order must be returned instead)."""
        order = self._order(body.order_id)
        if order["status"] != "pending":
            raise HTTPError(
                422, f"order {body.order_id} is {order['status']}; only a pending order can be cancelled"
            )
        order["status"] = "cancelled"
        return Order(**order)

    @tool
    async def return_order(self, body: OrderRequest) -> Order:
        """Return a delivered order for a refund."""
        order = self._order(body.order_id)
        if order["status"] != "delivered":
            raise HTTPError(
                422, f"order {body.order_id} is {order['status']}; only a delivered order can be returned"
            )
        order["status"] = "returned"
        return Order(**order)

    @tool
    async def change_address(self, body: ChangeAddressRequest) -> Order:
        """Change the shipping address of a pending order."""
        order = self._order(body.order_id)
        if order["status"] != "pending":
            raise HTTPError(
                422, f"order {body.order_id} is {order['status']}; only a pending order can be re-addressed"
            )
        order["address"] = body.address
        return Order(**order)

    async def verify(self, body: RetailVerifyRequest) -> RetailVerifyResponse:  # type: ignore[override]
        """1.0 when every order matches ``goal_orders`` (fields named there) and every other order is unchanged."""
        state = self.sessions.get(self.session_id or "", create=False)
        found = state is not None and ORDERS_KEY in state
        final: dict[str, Any] = copy.deepcopy(state[ORDERS_KEY]) if found and state else {}
        mismatches = []
        if found:
            for order_id, start in body.orders.items():
                want = {**start.model_dump(), **body.goal_orders.get(order_id, {})}
                got = final.get(order_id, {})
                for field, value in want.items():
                    if got.get(field) != value:
                        mismatches.append(f"{order_id}.{field}: want {value!r}, got {got.get(field)!r}")
        output = body.response.get("output") or []
        return RetailVerifyResponse(
            **body.model_dump(),
            reward=float(found and not mismatches),
            session_found=found,
            final_orders=final if found else None,
            mismatches=mismatches if found else ["no orders for this rollout (never seeded)"],
            num_tool_calls=len(function_calls(output)),
            num_user_turns=sum(1 for item in output if item.get("role") == "user"),
        )


if __name__ == "__main__":
    RetailServiceServer.run_webserver()
