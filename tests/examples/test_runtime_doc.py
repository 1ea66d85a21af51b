"""docs/runtime.md's agent, executed: it suspends on a refund intent and completes on the result."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

from keylane.authoring.tools import default_registry
from keylane.testing import AgentHarness

DOC = Path(__file__).resolve().parents[2] / "docs" / "runtime.md"


def doc_module() -> ModuleType:
    (block,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    module = ModuleType("runtime_doc")
    exec(compile(block, str(DOC), "exec"), module.__dict__)  # noqa: S102 - our own doc, on purpose
    return module


async def test_the_documented_agent_acts_suspends_and_completes_on_its_result() -> None:
    doc = doc_module()
    harness = AgentHarness(doc.agent, doc.config)

    await harness.send_event(b"customer-9", "order-17")
    [intent] = harness.intents()
    refund = default_registry.get("issue_refund")
    outcome = await refund.execute({"amount": 42})
    await harness.send_result(harness.result_for(intent, result_json=str(outcome)))

    assert intent.tool == "issue_refund" and intent.args_json == '{"amount": 42}'
    assert harness.outputs() == [(b"customer-9", b"OK")]
    assert harness.state(b"customer-9").memory.entries["messages"].value == ["order-17"]
    assert harness.errors() == []
