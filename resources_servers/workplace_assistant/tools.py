"""The workplace tools: argument models, what each tool does to a :class:`Workplace`, and replay.

Tool names and argument names are NeMo Gym's (so its rows and recorded rollouts run here);
the behaviour is this environment's own and is described in the README. A tool answers with
its result (wrapped as ``{"output": ...}`` by the server); bad arguments raise a 422 naming
the argument, unknown ids a 404, and neither changes any state.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date, datetime
from typing import Annotated, Any

import orjson
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from nemo_gym.base_resources_server import HTTPError, validation_error_body
from resources_servers.workplace_assistant.workplace import Workplace

PRODUCTS = ("Software", "Hardware", "Services", "Consulting", "Training")
STATUSES = ("Qualified", "Won", "Lost", "Lead", "Proposal")
LISTS = ("Backlog", "In Progress", "In Review", "Completed")
BOARDS = ("Back end", "Front end", "Design")
PLOT_VALUES = (
    "total_visits",
    "session_duration_seconds",
    "user_engaged",
    "visits_direct",
    "visits_referral",
    "visits_search_engine",
    "visits_social_media",
)
PLOT_TYPES = ("bar", "line", "scatter", "histogram")
TRAFFIC_SOURCES = ("direct", "referral", "search engine", "social media")
EMAIL_FIELDS = ("email_id", "inbox/outbox", "sender/recipient", "subject", "sent_datetime", "body")
EVENT_FIELDS = ("event_id", "event_name", "participant_email", "event_start", "duration")
TASK_FIELDS = ("task_id", "task_name", "assigned_to_email", "list_name", "due_date", "board")
MAX_PAGE_SIZE = 100
DEFAULT_PAGE_SIZE = 10


# ---- value normalizers (shared by argument models and update_* tools) ------------------------
def as_text(value: Any) -> Any:
    """Numbers become strings ("duration": 30 is as good as "30"); anything else is left as is."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


def email_address(value: str) -> str:
    """A lower-cased email address; ValueError when it does not look like one."""
    address = value.strip().lower()
    if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", address):
        raise ValueError(f"{value!r} is not an email address")
    return address


def calendar_date(value: str) -> str:
    """``YYYY-MM-DD`` (a timestamp is cut to its date)."""
    text = value.strip()
    try:
        return (
            date.fromisoformat(text[:10]).isoformat()
            if len(text) == 10
            else _parse_dt(text).date().isoformat()
        )
    except ValueError:
        raise ValueError(f"{value!r} is not a date; use YYYY-MM-DD") from None


def _parse_dt(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("T", " ").rstrip("Z"))


def _timestamp(bare_date: str) -> Callable[[str], str]:
    """``YYYY-MM-DD HH:MM:SS``; a bare date means the day's start, its end, or is refused."""

    def normalize(value: str) -> str:
        text = value.strip()
        if len(text) == 10:
            try:
                day = date.fromisoformat(text)
            except ValueError:
                raise ValueError(f"{value!r} is not a date or timestamp") from None
            if bare_date == "reject":
                raise ValueError(f"{value!r} has no time of day; use YYYY-MM-DD HH:MM:SS")
            return f"{day.isoformat()} {'23:59:59' if bare_date == 'end' else '00:00:00'}"
        try:
            return _parse_dt(text).strftime("%Y-%m-%d %H:%M:%S")
        except ValueError:
            raise ValueError(f"{value!r} is not a timestamp; use YYYY-MM-DD HH:MM:SS") from None

    return normalize


def minutes(value: str) -> str:
    """A positive whole number of minutes, as a string."""
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a number of minutes") from None
    if number <= 0 or number != int(number):
        raise ValueError(f"{value!r} is not a positive whole number of minutes")
    return str(int(number))


def one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    """Accept any letter case of ``choices`` and store the canonical spelling."""
    by_key = {c.casefold(): c for c in choices}

    def normalize(value: str) -> str:
        found = by_key.get(value.strip().casefold())
        if found is None:
            raise ValueError(f"{value!r} is not one of {', '.join(repr(c) for c in choices)}")
        return found

    return normalize


def non_empty(value: str) -> str:
    """Text with something in it."""
    if not value.strip():
        raise ValueError("must not be empty")
    return value


Text = Annotated[str, BeforeValidator(as_text)]
Required = Annotated[str, BeforeValidator(as_text), AfterValidator(non_empty)]
Email = Annotated[str, AfterValidator(email_address)]
Day = Annotated[str, AfterValidator(calendar_date)]
Start = Annotated[str, AfterValidator(_timestamp("reject"))]
TimeMin = Annotated[str, AfterValidator(_timestamp("start"))]
TimeMax = Annotated[str, AfterValidator(_timestamp("end"))]
Minutes = Annotated[str, BeforeValidator(as_text), AfterValidator(minutes)]


def Choice(choices: tuple[str, ...]) -> Any:  # noqa: N802 - used like a type
    """A string restricted to ``choices`` (any letter case in, canonical spelling out)."""
    return Annotated[str, AfterValidator(one_of(choices)), Field(json_schema_extra={"enum": list(choices)})]


def _arg(description: str, default: Any = ...) -> Any:
    return Field(default, description=description)


Page = Annotated[int, Field(ge=1, description="Page of results, from 1")]
PageSize = Annotated[
    int, Field(ge=1, le=MAX_PAGE_SIZE, description=f"Results per page (default {DEFAULT_PAGE_SIZE})")
]


class Args(BaseModel):
    """Base of every tool's arguments: unknown argument names are refused (422 naming them)."""

    model_config = ConfigDict(extra="forbid")


# ---- the operation registry ------------------------------------------------------------------
@dataclass(frozen=True)
class Operation:
    """One tool: its name, what the model is told it does, its arguments and its effect."""

    name: str
    description: str
    args: type[Args]
    run: Callable[[Workplace, Any], Any]


OPERATIONS: dict[str, Operation] = {}


def operation(name: str, description: str, args: type[Args]) -> Callable[[Callable[..., Any]], Any]:
    """Register a tool function under ``name``."""

    def register(func: Callable[[Workplace, Any], Any]) -> Callable[[Workplace, Any], Any]:
        OPERATIONS[name] = Operation(name, description, args, func)
        return func

    return register


def _paginate(items: list[dict[str, Any]], page: int, page_size: int, noun: str) -> Any:
    if not items:
        return f"No {noun} found."
    total_pages = math.ceil(len(items) / page_size)
    if page > total_pages:
        raise HTTPError(422, f"page: {page} is past the last page ({total_pages}) of {len(items)} {noun}")
    start = (page - 1) * page_size
    return {
        noun: [dict(item) for item in items[start : start + page_size]],
        "pagination": {
            f"total_{noun}": len(items),
            "page": page,
            "page_size": page_size,
            "total_pages": total_pages,
        },
    }


def _words_match(query: str | None, *fields: Any) -> bool:
    haystack = " ".join(str(f) for f in fields if f is not None).lower()
    return all(word in haystack for word in (query or "").lower().split())


def _company_address(ws: Workplace, value: str, argument: str) -> str:
    address = email_address(value)
    if address not in ws.fixtures.directory:
        raise HTTPError(
            422,
            f"{argument}: {address!r} is not in the company directory "
            "(look it up with company_directory_find_email_address)",
        )
    return address


def _update_value(field: str, value: str, rules: dict[str, Callable[[str], str]]) -> str:
    try:
        return rules[field](value)
    except ValueError as exc:
        raise HTTPError(422, f"new_value: {exc} (for field {field!r})") from None


# ---- company directory -----------------------------------------------------------------------
class FindEmailAddressArgs(Args):
    name: Text | None = _arg("A name or part of one; every word must appear in the address", None)


@operation(
    "company_directory_find_email_address",
    "Look up colleagues' email addresses by (part of) their name; matching ignores letter case.",
    FindEmailAddressArgs,
)
def find_email_address(ws: Workplace, a: FindEmailAddressArgs) -> list[str]:
    return [address for address in ws.fixtures.directory if _words_match(a.name, address)]


# ---- email -----------------------------------------------------------------------------------
class EmailIdArgs(Args):
    email_id: Required = _arg("The 8-digit id of the email")


class EmailInfoArgs(EmailIdArgs):
    field: Choice(EMAIL_FIELDS) = _arg("Which field of the email to return")  # type: ignore[valid-type]


class SearchEmailsArgs(Args):
    query: Text | None = _arg("Words that must all appear in the subject, body or sender/recipient", None)
    date_min: Day | None = _arg("Earliest sent date to include, YYYY-MM-DD", None)
    date_max: Day | None = _arg("Latest sent date to include, YYYY-MM-DD", None)
    page: Page = 1
    page_size: PageSize = DEFAULT_PAGE_SIZE


class SendEmailArgs(Args):
    recipient: Email = _arg("The recipient's email address")
    subject: Required = _arg("Subject line")
    body: Required = _arg("Message text")


class ForwardEmailArgs(EmailIdArgs):
    recipient: Email = _arg("Who to forward the email to")


class ReplyEmailArgs(EmailIdArgs):
    body: Required = _arg("Text of the reply")


@operation(
    "email_get_email_information_by_id",
    "Read one field of an email in Sam's mailbox.",
    EmailInfoArgs,
)
def get_email_information_by_id(ws: Workplace, a: EmailInfoArgs) -> dict[str, Any]:
    return {a.field: ws.record("emails", a.email_id, "email")[a.field]}


@operation(
    "email_search_emails",
    "Search Sam's inbox and outbox, newest first. An email matches when every query word occurs "
    "(ignoring case) in its subject, body or sender/recipient; dates bound the day it was sent.",
    SearchEmailsArgs,
)
def search_emails(ws: Workplace, a: SearchEmailsArgs) -> Any:
    found = [
        e
        for e in ws.tables["emails"].values()
        if _words_match(a.query, e["subject"], e["body"], e["sender/recipient"])
        and (a.date_min is None or e["sent_datetime"][:10] >= a.date_min)
        and (a.date_max is None or e["sent_datetime"][:10] <= a.date_max)
    ]
    found.sort(key=lambda e: e["sent_datetime"], reverse=True)
    return _paginate(found, a.page, a.page_size, "emails")


def _send(ws: Workplace, recipient: str, subject: str, body: str) -> str:
    email_id = ws.new_id("emails")
    ws.tables["emails"][email_id] = {
        "email_id": email_id,
        "inbox/outbox": "outbox",
        "sender/recipient": recipient,
        "subject": subject,
        "sent_datetime": ws.now,
        "body": body,
    }
    return email_id


@operation("email_send_email", "Send a new email from Sam's account.", SendEmailArgs)
def send_email(ws: Workplace, a: SendEmailArgs) -> str:
    _send(ws, a.recipient, a.subject, a.body)
    return "Email sent successfully."


@operation("email_delete_email", "Delete an email from Sam's mailbox.", EmailIdArgs)
def delete_email(ws: Workplace, a: EmailIdArgs) -> str:
    ws.record("emails", a.email_id, "email")
    del ws.tables["emails"][a.email_id]
    return "Email deleted successfully."


@operation(
    "email_forward_email",
    "Forward an email (same body, subject prefixed with 'FW: ') to someone.",
    ForwardEmailArgs,
)
def forward_email(ws: Workplace, a: ForwardEmailArgs) -> str:
    original = ws.record("emails", a.email_id, "email")
    _send(ws, a.recipient, f"FW: {original['subject']}", original["body"])
    return "Email forwarded successfully."


@operation(
    "email_reply_email",
    "Reply to an email: the answer goes to its sender/recipient with the subject prefixed 'Re: '.",
    ReplyEmailArgs,
)
def reply_email(ws: Workplace, a: ReplyEmailArgs) -> str:
    original = ws.record("emails", a.email_id, "email")
    subject = original["subject"]
    if not subject.lower().startswith("re:"):
        subject = f"Re: {subject}"
    _send(ws, original["sender/recipient"], subject, a.body)
    return "Email replied successfully."


# ---- calendar --------------------------------------------------------------------------------
EVENT_RULES: dict[str, Callable[[str], str]] = {
    "event_name": non_empty,
    "participant_email": email_address,
    "event_start": _timestamp("reject"),
    "duration": minutes,
}


class EventIdArgs(Args):
    event_id: Required = _arg("The 8-digit id of the event")


class EventInfoArgs(EventIdArgs):
    field: Choice(EVENT_FIELDS) = _arg("Which field of the event to return")  # type: ignore[valid-type]


class SearchEventsArgs(Args):
    query: Text | None = _arg("Words that must all appear in the event name or participant email", None)
    time_min: TimeMin | None = _arg("Only events ending at or after this time, YYYY-MM-DD HH:MM:SS", None)
    time_max: TimeMax | None = _arg("Only events starting at or before this time, YYYY-MM-DD HH:MM:SS", None)
    page: Page = 1
    page_size: PageSize = DEFAULT_PAGE_SIZE


class CreateEventArgs(Args):
    event_name: Required = _arg("Name of the meeting")
    participant_email: Email = _arg("Email address of the person invited")
    event_start: Start = _arg("Start time, YYYY-MM-DD HH:MM:SS")
    duration: Minutes = _arg("Length in minutes")


class UpdateEventArgs(EventIdArgs):
    field: Choice(tuple(EVENT_RULES)) = _arg("Which field to change")  # type: ignore[valid-type]
    new_value: Required = _arg("The new value (timestamps YYYY-MM-DD HH:MM:SS, durations in minutes)")


@operation("calendar_get_event_information_by_id", "Read one field of a calendar event.", EventInfoArgs)
def get_event_information_by_id(ws: Workplace, a: EventInfoArgs) -> dict[str, Any]:
    return {a.field: ws.record("calendar_events", a.event_id, "event")[a.field]}


@operation(
    "calendar_search_events",
    "Search Sam's calendar, earliest first. Every query word must occur (ignoring case) in the "
    "event name or participant email; the time bounds keep events overlapping the window.",
    SearchEventsArgs,
)
def search_events(ws: Workplace, a: SearchEventsArgs) -> Any:
    def overlaps(event: dict[str, Any]) -> bool:
        start = datetime.strptime(event["event_start"], "%Y-%m-%d %H:%M:%S")
        end = start.timestamp() + 60 * int(event["duration"])
        if a.time_min is not None and end < datetime.strptime(a.time_min, "%Y-%m-%d %H:%M:%S").timestamp():
            return False
        return a.time_max is None or event["event_start"] <= a.time_max

    found = [
        e
        for e in ws.tables["calendar_events"].values()
        if _words_match(a.query, e["event_name"], e["participant_email"]) and overlaps(e)
    ]
    found.sort(key=lambda e: (e["event_start"], e["event_id"]))
    return _paginate(found, a.page, a.page_size, "events")


@operation(
    "calendar_create_event", "Put a new meeting on Sam's calendar; answers its event id.", CreateEventArgs
)
def create_event(ws: Workplace, a: CreateEventArgs) -> str:
    event_id = ws.new_id("calendar_events")
    ws.tables["calendar_events"][event_id] = {
        "event_id": event_id,
        "event_name": a.event_name,
        "participant_email": a.participant_email,
        "event_start": a.event_start,
        "duration": a.duration,
    }
    return event_id


@operation("calendar_delete_event", "Remove a meeting from Sam's calendar.", EventIdArgs)
def delete_event(ws: Workplace, a: EventIdArgs) -> str:
    ws.record("calendar_events", a.event_id, "event")
    del ws.tables["calendar_events"][a.event_id]
    return "Event deleted successfully."


@operation("calendar_update_event", "Change one field of a calendar event.", UpdateEventArgs)
def update_event(ws: Workplace, a: UpdateEventArgs) -> str:
    event = ws.record("calendar_events", a.event_id, "event")
    event[a.field] = _update_value(a.field, a.new_value, EVENT_RULES)
    return "Event updated successfully."


# ---- analytics -------------------------------------------------------------------------------
class VisitorArgs(Args):
    visitor_id: Required = _arg("The visitor's id")


class RangeArgs(Args):
    time_min: Day | None = _arg("First day to include, YYYY-MM-DD (default: the first day on record)", None)
    time_max: Day | None = _arg("Last day to include, YYYY-MM-DD (default: the last day on record)", None)


class TrafficSourceArgs(RangeArgs):
    traffic_source: Choice(TRAFFIC_SOURCES) | None = _arg(  # type: ignore[valid-type]
        "Which source to count (left out: a count for every source)", None
    )


class CreatePlotArgs(Args):
    time_min: Day = _arg("First day to plot, YYYY-MM-DD")
    time_max: Day = _arg("Last day to plot, YYYY-MM-DD")
    value_to_plot: Choice(PLOT_VALUES) = _arg("Which daily value to plot")  # type: ignore[valid-type]
    plot_type: Choice(PLOT_TYPES) = _arg("Kind of chart")  # type: ignore[valid-type]


def _visits(ws: Workplace, a: RangeArgs) -> list[Any]:
    if a.time_min and a.time_max and a.time_min > a.time_max:
        raise HTTPError(422, f"time_min: {a.time_min} is after time_max {a.time_max}")
    return [
        v
        for v in ws.fixtures.visits
        if (a.time_min is None or v["date_of_visit"] >= a.time_min)
        and (a.time_max is None or v["date_of_visit"] <= a.time_max)
    ]


@operation(
    "analytics_get_visitor_information_by_id",
    "Every recorded website visit of one visitor.",
    VisitorArgs,
)
def get_visitor_information_by_id(ws: Workplace, a: VisitorArgs) -> list[dict[str, Any]]:
    visits = [dict(v) for v in ws.fixtures.visits if v["visitor_id"] == a.visitor_id]
    if not visits:
        raise HTTPError(404, f"visitor {a.visitor_id!r} not found")
    return visits


@operation(
    "analytics_create_plot",
    "Chart a daily website metric over a date range; answers the path of the saved image.",
    CreatePlotArgs,
)
def create_plot(ws: Workplace, a: CreatePlotArgs) -> str:
    if a.time_min > a.time_max:
        raise HTTPError(422, f"time_min: {a.time_min} is after time_max {a.time_max}")
    ws.plots.append(
        {
            "time_min": a.time_min,
            "time_max": a.time_max,
            "value_to_plot": a.value_to_plot,
            "plot_type": a.plot_type,
        }
    )
    return f"plots/{a.time_min}_{a.time_max}_{a.value_to_plot}_{a.plot_type}.png"


@operation("analytics_total_visits_count", "How many website visits happened in a date range.", RangeArgs)
def total_visits_count(ws: Workplace, a: RangeArgs) -> int:
    return len(_visits(ws, a))


@operation("analytics_engaged_users_count", "How many visits in a date range were engaged.", RangeArgs)
def engaged_users_count(ws: Workplace, a: RangeArgs) -> int:
    return sum(1 for v in _visits(ws, a) if v["user_engaged"])


@operation(
    "analytics_traffic_source_count",
    "How many visits in a date range came from a traffic source.",
    TrafficSourceArgs,
)
def traffic_source_count(ws: Workplace, a: TrafficSourceArgs) -> Any:
    visits = _visits(ws, a)
    if a.traffic_source is None:
        return {source: sum(1 for v in visits if v["traffic_source"] == source) for source in TRAFFIC_SOURCES}
    return sum(1 for v in visits if v["traffic_source"] == a.traffic_source)


@operation(
    "analytics_get_average_session_duration",
    "Mean visit length in seconds over a date range.",
    RangeArgs,
)
def get_average_session_duration(ws: Workplace, a: RangeArgs) -> Any:
    visits = _visits(ws, a)
    if not visits:
        return "No visits in this date range."
    return round(sum(v["session_duration_seconds"] for v in visits) / len(visits), 1)


# ---- project management ----------------------------------------------------------------------
class TaskIdArgs(Args):
    task_id: Required = _arg("The 8-digit id of the task")


class TaskInfoArgs(TaskIdArgs):
    field: Choice(TASK_FIELDS) = _arg("Which field of the task to return")  # type: ignore[valid-type]


class SearchTasksArgs(Args):
    task_name: Text | None = _arg("Words that must all appear in the task name", None)
    assigned_to_email: Text | None = _arg("(Part of) the assignee's email address", None)
    list_name: Choice(LISTS) | None = _arg("Column of the board", None)  # type: ignore[valid-type]
    due_date: Day | None = _arg("Due date, YYYY-MM-DD", None)
    board: Choice(BOARDS) | None = _arg("Board", None)  # type: ignore[valid-type]


class CreateTaskArgs(Args):
    task_name: Required = _arg("Name of the task")
    assigned_to_email: Email = _arg("Assignee's company email address")
    list_name: Choice(LISTS) = _arg("Column of the board")  # type: ignore[valid-type]
    due_date: Day = _arg("Due date, YYYY-MM-DD")
    board: Choice(BOARDS) = _arg("Board")  # type: ignore[valid-type]


TASK_RULES: dict[str, Callable[[str], str]] = {
    "task_name": non_empty,
    "assigned_to_email": email_address,
    "list_name": one_of(LISTS),
    "due_date": calendar_date,
    "board": one_of(BOARDS),
}


class UpdateTaskArgs(TaskIdArgs):
    field: Choice(tuple(TASK_RULES)) = _arg("Which field to change")  # type: ignore[valid-type]
    new_value: Required = _arg("The new value")


@operation("project_management_get_task_information_by_id", "Read one field of a task.", TaskInfoArgs)
def get_task_information_by_id(ws: Workplace, a: TaskInfoArgs) -> dict[str, Any]:
    return {a.field: ws.record("project_tasks", a.task_id, "task")[a.field]}


@operation(
    "project_management_search_tasks",
    "Find tasks on the project boards; every given filter must hold.",
    SearchTasksArgs,
)
def search_tasks(ws: Workplace, a: SearchTasksArgs) -> Any:
    found = [
        dict(t)
        for t in ws.tables["project_tasks"].values()
        if _words_match(a.task_name, t["task_name"])
        and (a.assigned_to_email is None or a.assigned_to_email.strip().lower() in t["assigned_to_email"])
        and (a.list_name is None or t["list_name"] == a.list_name)
        and (a.due_date is None or t["due_date"] == a.due_date)
        and (a.board is None or t["board"] == a.board)
    ]
    return found or "No tasks found."


@operation("project_management_create_task", "Add a task to a board; answers its task id.", CreateTaskArgs)
def create_task(ws: Workplace, a: CreateTaskArgs) -> str:
    assignee = _company_address(ws, a.assigned_to_email, "assigned_to_email")
    task_id = ws.new_id("project_tasks")
    ws.tables["project_tasks"][task_id] = {
        "task_id": task_id,
        "task_name": a.task_name,
        "assigned_to_email": assignee,
        "list_name": a.list_name,
        "due_date": a.due_date,
        "board": a.board,
    }
    return task_id


@operation("project_management_delete_task", "Remove a task from its board.", TaskIdArgs)
def delete_task(ws: Workplace, a: TaskIdArgs) -> str:
    ws.record("project_tasks", a.task_id, "task")
    del ws.tables["project_tasks"][a.task_id]
    return "Task deleted successfully."


@operation("project_management_update_task", "Change one field of a task.", UpdateTaskArgs)
def update_task(ws: Workplace, a: UpdateTaskArgs) -> str:
    task = ws.record("project_tasks", a.task_id, "task")
    value = _update_value(a.field, a.new_value, TASK_RULES)
    if a.field == "assigned_to_email":
        value = _company_address(ws, value, "new_value")
    task[a.field] = value
    return "Task updated successfully."


# ---- customer relationship manager -----------------------------------------------------------
CUSTOMER_RULES: dict[str, Callable[[str], str]] = {
    "customer_name": non_empty,
    "assigned_to_email": email_address,
    "customer_email": email_address,
    "customer_phone": non_empty,
    "last_contact_date": calendar_date,
    "product_interest": one_of(PRODUCTS),
    "status": one_of(STATUSES),
    "notes": lambda value: value,
    "follow_up_by": calendar_date,
}


class CustomerIdArgs(Args):
    customer_id: Required = _arg("The 8-digit id of the customer")


class SearchCustomersArgs(Args):
    customer_name: Text | None = _arg("Words that must all appear in the customer's name", None)
    customer_email: Text | None = _arg("(Part of) the customer's email address", None)
    product_interest: Choice(PRODUCTS) | None = _arg("Product the customer is interested in", None)  # type: ignore[valid-type]
    status: Choice(STATUSES) | None = _arg("Pipeline stage", None)  # type: ignore[valid-type]
    assigned_to_email: Text | None = _arg("(Part of) the account owner's email address", None)
    last_contact_date_min: Day | None = _arg("Last contacted on or after, YYYY-MM-DD", None)
    last_contact_date_max: Day | None = _arg("Last contacted on or before, YYYY-MM-DD", None)
    follow_up_by_min: Day | None = _arg("Follow-up due on or after, YYYY-MM-DD", None)
    follow_up_by_max: Day | None = _arg("Follow-up due on or before, YYYY-MM-DD", None)
    page: Page = 1
    page_size: PageSize = DEFAULT_PAGE_SIZE


class UpdateCustomerArgs(CustomerIdArgs):
    field: Choice(tuple(CUSTOMER_RULES)) = _arg("Which field to change")  # type: ignore[valid-type]
    new_value: Text = _arg("The new value (dates YYYY-MM-DD)")


class AddCustomerArgs(Args):
    customer_name: Required = _arg("The customer's name")
    assigned_to_email: Email = _arg("Company email address of the account owner")
    status: Choice(STATUSES) = _arg("Pipeline stage")  # type: ignore[valid-type]
    customer_email: Email | None = _arg("The customer's email address", None)
    customer_phone: Text | None = _arg("The customer's phone number", None)
    last_contact_date: Day | None = _arg("When the customer was last contacted, YYYY-MM-DD", None)
    product_interest: Choice(PRODUCTS) | None = _arg("Product the customer is interested in", None)  # type: ignore[valid-type]
    notes: Text | None = _arg("Free-form notes", None)
    follow_up_by: Day | None = _arg("Next follow-up date, YYYY-MM-DD", None)


def _between(value: str | None, low: str | None, high: str | None) -> bool:
    if low is None and high is None:
        return True
    if value is None:
        return False
    return (low is None or value >= low) and (high is None or value <= high)


@operation(
    "customer_relationship_manager_search_customers",
    "Find customers in the CRM, by id order; every given filter must hold (text filters ignore case).",
    SearchCustomersArgs,
)
def search_customers(ws: Workplace, a: SearchCustomersArgs) -> Any:
    def matches(c: dict[str, Any]) -> bool:
        return (
            _words_match(a.customer_name, c["customer_name"])
            and (a.customer_email is None or a.customer_email.strip().lower() in (c["customer_email"] or ""))
            and (a.product_interest is None or c["product_interest"] == a.product_interest)
            and (a.status is None or c["status"] == a.status)
            and (a.assigned_to_email is None or a.assigned_to_email.strip().lower() in c["assigned_to_email"])
            and _between(c["last_contact_date"], a.last_contact_date_min, a.last_contact_date_max)
            and _between(c["follow_up_by"], a.follow_up_by_min, a.follow_up_by_max)
        )

    found = sorted((c for c in ws.tables["customers"].values() if matches(c)), key=lambda c: c["customer_id"])
    return _paginate(found, a.page, a.page_size, "customers")


@operation(
    "customer_relationship_manager_update_customer",
    "Change one field of a customer record.",
    UpdateCustomerArgs,
)
def update_customer(ws: Workplace, a: UpdateCustomerArgs) -> str:
    customer = ws.record("customers", a.customer_id, "customer")
    value = _update_value(a.field, a.new_value, CUSTOMER_RULES)
    if a.field == "assigned_to_email":
        value = _company_address(ws, value, "new_value")
    customer[a.field] = value
    return "Customer updated successfully."


@operation(
    "customer_relationship_manager_add_customer",
    "Add a customer to the CRM; answers the new customer id.",
    AddCustomerArgs,
)
def add_customer(ws: Workplace, a: AddCustomerArgs) -> str:
    owner = _company_address(ws, a.assigned_to_email, "assigned_to_email")
    customer_id = ws.new_id("customers")
    ws.tables["customers"][customer_id] = {
        "customer_id": customer_id,
        "customer_name": a.customer_name,
        "assigned_to_email": owner,
        "customer_email": a.customer_email,
        "customer_phone": a.customer_phone,
        "last_contact_date": a.last_contact_date,
        "product_interest": a.product_interest,
        "status": a.status,
        "follow_up_by": a.follow_up_by,
        "notes": a.notes,
    }
    return customer_id


@operation("customer_relationship_manager_delete_customer", "Remove a customer from the CRM.", CustomerIdArgs)
def delete_customer(ws: Workplace, a: CustomerIdArgs) -> str:
    ws.record("customers", a.customer_id, "customer")
    del ws.tables["customers"][a.customer_id]
    return "Customer deleted successfully."


# ---- using the registry ----------------------------------------------------------------------
def call_tool(ws: Workplace, name: str, arguments: Any) -> Any:
    """Run one tool call given as a name and a JSON string or object of arguments.

    Raises :class:`HTTPError` (404 unknown tool or id, 422 bad arguments) without touching state.
    """
    op = OPERATIONS.get(name)
    if op is None:
        raise HTTPError(404, f"there is no tool named {name!r}")
    if isinstance(arguments, str | bytes):
        try:
            arguments = orjson.loads(arguments or b"{}")
        except orjson.JSONDecodeError as exc:
            raise HTTPError(422, f"arguments are not valid JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise HTTPError(422, "arguments must be a JSON object")
    try:
        args = op.args.model_validate(arguments)
    except ValidationError as exc:
        raise HTTPError(422, validation_error_body(exc, name, "arguments")["error"]) from None
    return op.run(ws, args)


def replay_calls(ws: Workplace, calls: Iterable[dict[str, Any]]) -> list[str]:
    """Apply ``{name, arguments}`` calls in order; failed calls change nothing and are reported."""
    errors = []
    for index, call in enumerate(calls):
        name = str(call.get("name", ""))
        try:
            call_tool(ws, name, call.get("arguments", "{}"))
        except HTTPError as exc:
            errors.append(f"call {index} {name}: HTTP {exc.status_code}: {exc.message}")
    return errors


def tool_definitions() -> list[dict[str, Any]]:
    """The Responses API ``tools`` list for every workplace tool (what a dataset row offers)."""
    definitions = []
    for op in OPERATIONS.values():
        schema = op.args.model_json_schema()
        properties = {}
        for arg_name, prop in (schema.get("properties") or {}).items():
            typed: dict[str, Any] = next(
                (t for t in prop.get("anyOf", [prop]) if t.get("type") != "null"), {}
            )
            clean: dict[str, Any] = {"type": typed.get("type", "string")}
            for key in ("description", "enum", "minimum", "maximum"):
                if key in prop or key in typed:
                    clean[key] = prop.get(key, typed.get(key))
            properties[arg_name] = clean
        definitions.append(
            {
                "type": "function",
                "name": op.name,
                "description": op.description,
                "parameters": {
                    "type": "object",
                    "properties": properties,
                    "required": list(schema.get("required") or []),
                    "additionalProperties": False,
                },
                "strict": False,
            }
        )
    return definitions
