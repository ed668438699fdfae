"""A real MCP server on stdio for the agents' MCP tests: one tool, ``charge``, with an effect.

Run as ``python mcp_server.py``: it speaks MCP on stdin/stdout (``mcp``'s ``MCPServer``).
``charge(customer, amount)`` appends ``charge CUSTOMER AMOUNT`` to the sweep's effect log
(``AFK_SWEEP_LOG``, through ``record_effect``) and to ``MCP_EFFECTS`` when set, so a test
sees how often the tool ran.
"""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer

from afk_local.testing import record_effect

server = MCPServer("billing")


@server.tool()
def charge(customer: str, amount: int) -> str:
    """Charge ``customer`` ``amount`` EUR (the side effect that must happen once)."""
    line = f"charge {customer} {amount}"
    record_effect(line)
    effects = os.environ.get("MCP_EFFECTS")
    if effects:
        with open(effects, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
    return f"charged {customer} {amount} EUR"


if __name__ == "__main__":
    server.run("stdio")
