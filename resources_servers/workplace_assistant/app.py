"""workplace_assistant: a company's email, calendar, CRM, project board and analytics as tools.

Each rollout works on its own copy of the company data (opened by ``/seed_session``). The
reward compares the state the rollout left with the state the row's ``ground_truth`` calls
leave on a fresh copy: 1.0 when they are the same, else 0.0, with the differences listed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

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
from resources_servers.workplace_assistant.tools import (
    OPERATIONS,
    AddCustomerArgs,
    Args,
    CreateEventArgs,
    CreatePlotArgs,
    CreateTaskArgs,
    CustomerIdArgs,
    EmailIdArgs,
    EmailInfoArgs,
    EventIdArgs,
    EventInfoArgs,
    FindEmailAddressArgs,
    ForwardEmailArgs,
    RangeArgs,
    ReplyEmailArgs,
    SearchCustomersArgs,
    SearchEmailsArgs,
    SearchEventsArgs,
    SearchTasksArgs,
    SendEmailArgs,
    TaskIdArgs,
    TaskInfoArgs,
    TrafficSourceArgs,
    UpdateCustomerArgs,
    UpdateEventArgs,
    UpdateTaskArgs,
    VisitorArgs,
    replay_calls,
)
from resources_servers.workplace_assistant.workplace import (
    FIXTURES_DIR,
    Fixtures,
    Workplace,
    load_fixtures,
    state_diff,
)

STATE_KEY = "workplace"


class WorkplaceAssistantConfig(BaseResourcesServerConfig):
    """``fixtures_dir``: where the company data lives; ``current_datetime``: "now" for new emails.

    ``verify_state``: which state is compared with the gold state. ``session`` (default): what
    this rollout's tool calls actually did, when its session was seeded. ``response``: NeMo
    Gym's rule, the response's function calls replayed on fresh data (the session is ignored).
    """

    fixtures_dir: str = str(FIXTURES_DIR)
    current_datetime: str = "2023-11-30 23:59:00"
    verify_state: Literal["session", "response"] = "session"


class GoldCall(BaseModel):
    """One reference call: a tool name and its arguments (a JSON string, as rows store them)."""

    model_config = ConfigDict(extra="allow")

    name: str
    arguments: str | dict[str, Any] = "{}"


class WorkplaceVerifyRequest(BaseVerifyRequest):
    """The row must carry ``ground_truth``: the calls that solve the task (may be empty)."""

    ground_truth: list[GoldCall]


class WorkplaceVerifyResponse(BaseVerifyResponse):
    """Diagnostics: whether the states matched and, if not, every difference found."""

    # The row's other fields stay in the rollout (the base answer, as NeMo Gym's, drops them).
    model_config = ConfigDict(extra="allow")

    state_matches: bool
    state_diff: list[str]
    state_source: Literal["session", "response_replay"]
    gold_call_errors: list[str]
    replay_call_errors: list[str]
    num_function_calls: int


class WorkplaceAssistantServer(SimpleResourcesServer):
    """27 workplace tools over per-session state; reward by final-state comparison."""

    config: WorkplaceAssistantConfig
    plain_bodies = True  # handlers read response/responses_create_params as dicts

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Read at start-up so a broken fixture file stops the server, not the first rollout.
        self.fixtures: Fixtures = load_fixtures(Path(self.config.fixtures_dir))

    async def seed_session(self, body: BaseSeedSessionRequest) -> BaseSeedSessionResponse:
        """Give this rollout a fresh copy of the company data."""
        self.session[STATE_KEY] = self._fresh()
        return BaseSeedSessionResponse()

    async def verify(self, body: WorkplaceVerifyRequest) -> WorkplaceVerifyResponse:  # type: ignore[override]
        """1.0 when the rollout's final state equals the gold calls' final state, else 0.0.

        The rollout's state is this session's (what its tool calls did). A session that was
        never seeded (an offline re-score of a saved rollout) replays the response's
        function calls on fresh state instead.
        """
        calls = [
            {"name": c.get("name"), "arguments": c.get("arguments")}
            for c in function_calls(body.response.get("output") or [])
        ]
        gold = [g.model_dump() for g in body.ground_truth]
        session_state = self.session.get(STATE_KEY) if self.config.verify_state == "session" else None
        # Replaying and comparing ~1000 records is CPU work: keep it off the event loop.
        diff, gold_errors, replay_errors = await asyncio.to_thread(self._compare, session_state, calls, gold)
        # Built as one dict so a row that already carries these keys (a re-scored rollout) is overwritten.
        fields = body.model_dump()
        fields.update(
            reward=0.0 if diff else 1.0,
            state_matches=not diff,
            state_diff=diff[:25] + ([f"... and {len(diff) - 25} more"] if len(diff) > 25 else []),
            state_source="session" if session_state is not None else "response_replay",
            gold_call_errors=gold_errors,
            replay_call_errors=replay_errors,
            num_function_calls=len(calls),
        )
        return WorkplaceVerifyResponse(**fields)

    def _compare(
        self, session_state: Workplace | None, calls: list[dict[str, Any]], gold: list[dict[str, Any]]
    ) -> tuple[list[str], list[str], list[str]]:
        replay_errors: list[str] = []
        actual = session_state
        if actual is None:
            actual = self._fresh()
            replay_errors = replay_calls(actual, calls)
        expected = self._fresh()
        gold_errors = replay_calls(expected, gold)
        return state_diff(actual, expected), gold_errors, replay_errors

    def _fresh(self) -> Workplace:
        return Workplace(self.fixtures, self.config.current_datetime)

    def _run(self, name: str, body: Args) -> dict[str, Any]:
        state = self.session.get(STATE_KEY)
        if state is None:
            if self.session_id is not None:
                self.sessions.free(self.session_id)  # don't keep an empty session for a stray call
            raise HTTPError(
                409, "this session has no workplace: call /seed_session first (or it expired after its TTL)"
            )
        return {"output": OPERATIONS[name].run(state, body)}

    # ---- tools (names and arguments as in NeMo Gym's rows; behaviour in tools.py) -----------
    @tool
    async def company_directory_find_email_address(self, body: FindEmailAddressArgs) -> dict[str, Any]:
        """Colleagues' addresses matching a name."""
        return self._run("company_directory_find_email_address", body)

    @tool
    async def email_get_email_information_by_id(self, body: EmailInfoArgs) -> dict[str, Any]:
        """One field of an email."""
        return self._run("email_get_email_information_by_id", body)

    @tool
    async def email_search_emails(self, body: SearchEmailsArgs) -> dict[str, Any]:
        """Emails matching words and dates, newest first."""
        return self._run("email_search_emails", body)

    @tool
    async def email_send_email(self, body: SendEmailArgs) -> dict[str, Any]:
        """Send an email."""
        return self._run("email_send_email", body)

    @tool
    async def email_delete_email(self, body: EmailIdArgs) -> dict[str, Any]:
        """Delete an email."""
        return self._run("email_delete_email", body)

    @tool
    async def email_forward_email(self, body: ForwardEmailArgs) -> dict[str, Any]:
        """Forward an email."""
        return self._run("email_forward_email", body)

    @tool
    async def email_reply_email(self, body: ReplyEmailArgs) -> dict[str, Any]:
        """Reply to an email."""
        return self._run("email_reply_email", body)

    @tool
    async def calendar_get_event_information_by_id(self, body: EventInfoArgs) -> dict[str, Any]:
        """One field of an event."""
        return self._run("calendar_get_event_information_by_id", body)

    @tool
    async def calendar_search_events(self, body: SearchEventsArgs) -> dict[str, Any]:
        """Events matching words and a time window, earliest first."""
        return self._run("calendar_search_events", body)

    @tool
    async def calendar_create_event(self, body: CreateEventArgs) -> dict[str, Any]:
        """Create an event."""
        return self._run("calendar_create_event", body)

    @tool
    async def calendar_delete_event(self, body: EventIdArgs) -> dict[str, Any]:
        """Delete an event."""
        return self._run("calendar_delete_event", body)

    @tool
    async def calendar_update_event(self, body: UpdateEventArgs) -> dict[str, Any]:
        """Change one field of an event."""
        return self._run("calendar_update_event", body)

    @tool
    async def analytics_get_visitor_information_by_id(self, body: VisitorArgs) -> dict[str, Any]:
        """A visitor's visits."""
        return self._run("analytics_get_visitor_information_by_id", body)

    @tool
    async def analytics_create_plot(self, body: CreatePlotArgs) -> dict[str, Any]:
        """Create a chart (recorded in state)."""
        return self._run("analytics_create_plot", body)

    @tool
    async def analytics_total_visits_count(self, body: RangeArgs) -> dict[str, Any]:
        """Visits in a date range."""
        return self._run("analytics_total_visits_count", body)

    @tool
    async def analytics_engaged_users_count(self, body: RangeArgs) -> dict[str, Any]:
        """Engaged visits in a date range."""
        return self._run("analytics_engaged_users_count", body)

    @tool
    async def analytics_traffic_source_count(self, body: TrafficSourceArgs) -> dict[str, Any]:
        """Visits by traffic source in a date range."""
        return self._run("analytics_traffic_source_count", body)

    @tool
    async def analytics_get_average_session_duration(self, body: RangeArgs) -> dict[str, Any]:
        """Mean visit length in a date range."""
        return self._run("analytics_get_average_session_duration", body)

    @tool
    async def project_management_get_task_information_by_id(self, body: TaskInfoArgs) -> dict[str, Any]:
        """One field of a task."""
        return self._run("project_management_get_task_information_by_id", body)

    @tool
    async def project_management_search_tasks(self, body: SearchTasksArgs) -> dict[str, Any]:
        """Tasks matching filters."""
        return self._run("project_management_search_tasks", body)

    @tool
    async def project_management_create_task(self, body: CreateTaskArgs) -> dict[str, Any]:
        """Create a task."""
        return self._run("project_management_create_task", body)

    @tool
    async def project_management_delete_task(self, body: TaskIdArgs) -> dict[str, Any]:
        """Delete a task."""
        return self._run("project_management_delete_task", body)

    @tool
    async def project_management_update_task(self, body: UpdateTaskArgs) -> dict[str, Any]:
        """Change one field of a task."""
        return self._run("project_management_update_task", body)

    @tool
    async def customer_relationship_manager_search_customers(
        self, body: SearchCustomersArgs
    ) -> dict[str, Any]:
        """Customers matching filters."""
        return self._run("customer_relationship_manager_search_customers", body)

    @tool
    async def customer_relationship_manager_update_customer(self, body: UpdateCustomerArgs) -> dict[str, Any]:
        """Change one field of a customer."""
        return self._run("customer_relationship_manager_update_customer", body)

    @tool
    async def customer_relationship_manager_add_customer(self, body: AddCustomerArgs) -> dict[str, Any]:
        """Add a customer."""
        return self._run("customer_relationship_manager_add_customer", body)

    @tool
    async def customer_relationship_manager_delete_customer(self, body: CustomerIdArgs) -> dict[str, Any]:
        """Delete a customer."""
        return self._run("customer_relationship_manager_delete_customer", body)


if __name__ == "__main__":
    WorkplaceAssistantServer.run_webserver()
