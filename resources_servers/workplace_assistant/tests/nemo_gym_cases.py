"""NeMo Gym's workplace_assistant verify test cases (its tests/test_app.py ``test_verify`` and
``test_stateful_email_deletion_and_fetch``), as data: the model's calls equal the ground truth,
so the final states match and NeMo Gym gives 1.0."""

from typing import Any

from nemo_gym.response_items import function_call_item, function_call_output_item
from nemo_gym.testing import ParityCase

SYSTEM = (
    "Today's date is Thursday, 2023-11-30 and the current time is 23:59:00. Remember the current date "
    "and time when answering queries. Meetings must not start before 9am or end after 6pm."
)
REPLY = '{"email_id": "00000057", "body": "Thanks for the update - I will get back to you tomorrow."}'


def case(
    name: str, request: str, output: list[dict[str, Any]], ground_truth: list[dict[str, str]]
) -> ParityCase:
    """A row asking ``request``; ``ground_truth`` calls (JSON-string arguments, NeMo Gym's shape)."""
    row = {
        "responses_create_params": {
            "input": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": request}],
        },
        "ground_truth": ground_truth,
        "category": "workplace_assistant_email",
        "environment_name": "workplace_assistant",
        "id": "0",
    }
    return ParityCase(name, row, output, 1.0)


CASES = [
    case(
        "reply as the ground truth does",
        "Reply to carlos's last email about 'Task Update on Develop prototype for report generation' with "
        "'Thanks for the update - I will get back to you tomorrow.'",
        [function_call_item("email_reply_email", REPLY, "call_1")],
        [{"name": "email_reply_email", "arguments": REPLY}],
    ),
    case(
        "delete then fetch as the ground truth does",
        "Delete the email 00000146 and then check it is gone.",
        [
            function_call_item("email_delete_email", '{"email_id":"00000146"}', "call_1"),
            function_call_output_item("call_1", '"Email deleted successfully."'),
            function_call_item(
                "email_get_email_information_by_id", '{"email_id":"00000146","field":"email_id"}', "call_2"
            ),
            function_call_output_item("call_2", '"Email not found."'),
        ],
        [
            {"name": "email_delete_email", "arguments": '{"email_id": "00000146"}'},
            {
                "name": "email_get_email_information_by_id",
                "arguments": '{"email_id": "00000146", "field": "email_id"}',
            },
        ],
    ),
]
